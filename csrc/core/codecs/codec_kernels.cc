// Picks the codec kernel table for this CPU, once (codec_kernels.h).
#include "codec_kernels.h"

#include <cstring>

namespace pycomm::codecs {
namespace {

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
// __builtin_cpu_supports reads the CPUID results that libgcc gathers in a constructor; the explicit
// __builtin_cpu_init makes the answer right even if this runs from another constructor first.
// The OS must also save the wider registers (XSAVE state): libgcc's answer already accounts for
// that (it clears AVX/AVX-512 when XGETBV says the OS does not enable them).
bool cpuRunsAvx2() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c");
}

bool cpuRunsAvx512() {
  __builtin_cpu_init();
  return cpuRunsAvx2() && __builtin_cpu_supports("avx512f");
}
#else
bool cpuRunsAvx2() { return false; }
bool cpuRunsAvx512() { return false; }
#endif

struct IsaEntry {
  const char* name;
  const CodecKernels* (*table)();
  bool (*cpuRuns)();
};

const CodecKernels* scalarTable() { return &scalarKernels(); }
bool always() { return true; }

// Slowest first; selection takes the last one the CPU runs.
constexpr IsaEntry kIsas[] = {
    {"scalar", scalarTable, always},
    {"avx2", avx2Kernels, cpuRunsAvx2},
    {"avx512", avx512Kernels, cpuRunsAvx512},
};

const CodecKernels& selectKernels() {
  const CodecKernels* chosen = &scalarKernels();
  for (const IsaEntry& entry : kIsas) {
    const CodecKernels* table = entry.table();
    if (table != nullptr && entry.cpuRuns()) chosen = table;
  }
  return *chosen;
}

}  // namespace

const CodecKernels& activeKernels() {
  // A function-local static: safe for a caller that runs before this file's own static
  // initialization (another translation unit's constructor), and thread-safe.
  static const CodecKernels& active = selectKernels();
  return active;
}

namespace {
// Makes the choice while the library loads rather than on the first codec call, so that no
// collective pays for it and every thread sees the same table from the start.
[[maybe_unused]] const CodecKernels& gChosenAtLoad = activeKernels();
}  // namespace

const CodecKernels* kernelsForIsa(const char* isa) {
  for (const IsaEntry& entry : kIsas) {
    if (std::strcmp(entry.name, isa) != 0) continue;
    const CodecKernels* table = entry.table();
    return table != nullptr && entry.cpuRuns() ? table : nullptr;
  }
  return nullptr;
}

std::vector<const char*> knownCodecIsas() {
  std::vector<const char*> names;
  for (const IsaEntry& entry : kIsas) names.push_back(entry.name);
  return names;
}

}  // namespace pycomm::codecs
