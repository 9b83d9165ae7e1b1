// Shrink planning and agreement without torch: planShrink's checks and renumbering, and
// agreeOnShrink on threads over an in-memory store: survivors that agree go on, survivors that
// disagree all fail at once naming both sets, and a survivor that never comes is named after the
// timeout.
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/shrink.h"
#include "harness.h"

namespace {

using namespace pycomm;
using Clock = std::chrono::steady_clock;
using testing::MemoryStore;

template <typename E, typename F>
std::string thrown(F&& f) {
  try {
    f();
  } catch (const E& e) {
    return e.what();
  }
  return {};
}

void testPlan() {
  const ShrinkPlan plan = planShrink(3, 5, {1, 4}, "[rank 3/5]");
  EXPECT_TRUE(plan.excluded == std::vector<int>({1, 4}), describeRanks(plan.excluded));
  EXPECT_TRUE(plan.survivors == std::vector<int>({0, 2, 3}), describeRanks(plan.survivors));
  EXPECT_TRUE(plan.newRank == 2, plan.newRank);
  const ShrinkPlan unsorted = planShrink(0, 4, {3, 1}, "");
  EXPECT_TRUE(unsorted.excluded == std::vector<int>({1, 3}) && unsorted.newRank == 0, describeRanks(unsorted.excluded));

  const std::pair<std::vector<int64_t>, const char*> bad[] = {
      {{}, "no rank to exclude"},      {{5}, "not in the group"},         {{-1}, "not in the group"},
      {{2, 2}, "listed twice"},        {{0, 1, 2, 3, 4}, "leaves no rank"}, {{3}, "this rank (3)"},
  };
  for (const auto& [excluded, expected] : bad) {
    const std::string message = thrown<InvalidUsageError>([&] { planShrink(3, 5, excluded, "[rank 3/5]"); });
    EXPECT_TRUE(message.find(expected) != std::string::npos && message.find("[rank 3/5]") != std::string::npos,
                "expected '", expected, "', got '", message, "'");
  }
}

Config config(int rank, int size) {
  Config c;
  c.rank = rank;
  c.size = size;
  c.groupName = "g";
  c.chunkBytes = 4096;
  return c;
}

void testAgreement() {
  MemoryStore store;
  std::vector<Config> next(4);
  testing::runRanks(4, [&](int rank) {
    if (rank == 2) return;  // lost: never comes
    const ShrinkPlan plan = planShrink(rank, 4, {2}, "");
    agreeOnShrink(store, "s/", plan, rank, std::chrono::seconds(10), "");
    next[rank] = shrunkConfig(config(rank, 4), plan);
  });
  for (int rank : {0, 1, 3}) {
    EXPECT_TRUE(next[rank].size == 3 && next[rank].rank == (rank == 3 ? 2 : rank) && next[rank].groupName == "g:shrunk" &&
                    next[rank].chunkBytes == 4096,
                "rank ", rank, ": new rank ", next[rank].rank, " of ", next[rank].size, " ", next[rank].groupName);
  }
}

void testDisagreementFailsEveryoneAtOnce() {
  MemoryStore store;
  std::vector<std::string> messages(3);
  std::vector<double> seconds(3);
  testing::runRanks(3, [&](int rank) {
    const ShrinkPlan plan = planShrink(rank, 3, {(rank + 1) % 3}, "");
    const auto start = Clock::now();
    messages[rank] = thrown<InvalidUsageError>([&] {
      agreeOnShrink(store, "s/", plan, rank, std::chrono::seconds(30), strCat("[rank ", rank, "/3]"));
    });
    seconds[rank] = std::chrono::duration<double>(Clock::now() - start).count();
  });
  for (int rank = 0; rank < 3; ++rank) {
    const std::string mine = strCat("[", (rank + 1) % 3, "]");
    EXPECT_TRUE(messages[rank].find("disagree") != std::string::npos && messages[rank].find(mine) != std::string::npos,
                "rank ", rank, ": '", messages[rank], "'");
    EXPECT_TRUE(seconds[rank] < 5.0, "rank ", rank, " waited ", seconds[rank], " s for a disagreement");
  }
}

void testMissingSurvivorIsNamedAfterTheTimeout() {
  MemoryStore store;
  const ShrinkPlan plan = planShrink(0, 3, {1}, "");
  const std::string message = thrown<TimeoutError>(
      [&] { agreeOnShrink(store, "s/", plan, 0, std::chrono::milliseconds(200), "[rank 0/3]"); });
  EXPECT_TRUE(message.find("ranks [2] did not join") != std::string::npos && message.find("[rank 0/3]") != std::string::npos,
              "'", message, "'");
}

}  // namespace

int main() {
  testPlan();
  testAgreement();
  testDisagreementFailsEveryoneAtOnce();
  testMissingSurvivorIsNamedAfterTheTimeout();
  const int failed = pycomm::testing::failures();
  std::printf("%s: %d failure(s)\n", failed ? "FAILED" : "ok", failed);
  return failed ? 1 : 0;
}
