/* How fast this host moves data between two cores right now, with no library in the way: two
 * processes exchange half of `bytes` each way through shared memory (memcpy in, a flag, memcpy out),
 * twice per round, as a world-2 all-reduce does, and the median round time of a few loops is printed
 * in microseconds. On a virtual machine this time can change by 3-4x from one second to the next
 * (the hypervisor placing the two vCPUs apart or together), and every library's small-message time
 * over loopback TCP or shared memory moves with it: benchmarks/peers.py --probe runs this before
 * and after each peer to tell the host's modes apart. With `tcp` the halves go over a loopback TCP
 * connection instead (TCP_NODELAY, nonblocking receives spinning): the least any library's TCP
 * all-reduce of that size can take here. Both ranks send before they receive, so a half must fit
 * in the socket buffers: up to 256 KiB in all. Each process gives up after 60 s (SIGALRM), and the
 * child dies with the parent.
 *
 *     cc -O2 -o host_probe host_probe.c && ./host_probe [bytes=65536] [rounds=2000] [loops=3] [shm|tcp]
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static double now_us(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec * 1e6 + t.tv_nsec / 1e3;
}

static int by_value(const void* a, const void* b) {
  const double x = *(const double*)a, y = *(const double*)b;
  return (x > y) - (x < y);
}

/* Both ranks reach `seq` on flag `which` before either goes on. */
static void meet(_Atomic long* flags, int rank, int which, long seq) {
  atomic_store(&flags[(rank * 2 + which) * 16], seq);
  while (atomic_load(&flags[((1 - rank) * 2 + which) * 16]) < seq) {
  }
}

static void send_all(int fd, const char* p, size_t n) {
  while (n > 0) {
    const ssize_t r = send(fd, p, n, MSG_NOSIGNAL);
    if (r <= 0) {
      perror("host_probe: send");
      exit(1);
    }
    p += r;
    n -= (size_t)r;
  }
}

static void recv_all(int fd, char* p, size_t n) {
  while (n > 0) {
    const ssize_t r = recv(fd, p, n, MSG_DONTWAIT);
    if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) continue;
    if (r <= 0) {
      if (r == 0) fprintf(stderr, "host_probe: recv: the other process closed the connection\n");
      else perror("host_probe: recv");
      exit(1);
    }
    p += r;
    n -= (size_t)r;
  }
}

/* A listening socket on 127.0.0.1, made before the fork; the parent accepts, the child connects. */
static int tcp_listener(struct sockaddr_in* addr) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  memset(addr, 0, sizeof *addr);
  addr->sin_family = AF_INET;
  addr->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof *addr;
  if (fd < 0 || bind(fd, (struct sockaddr*)addr, len) != 0 || listen(fd, 1) != 0 ||
      getsockname(fd, (struct sockaddr*)addr, &len) != 0) {
    perror("host_probe: listen");
    exit(1);
  }
  return fd;
}

int main(int argc, char** argv) {
  const size_t half = (size_t)(argc > 1 ? atol(argv[1]) : 65536) / 2;
  const int rounds = argc > 2 ? atoi(argv[2]) : 2000;
  const int loops = argc > 3 ? atoi(argv[3]) : 3;
  const int tcp = argc > 4 && strcmp(argv[4], "tcp") == 0;
  const size_t max_half = tcp ? 128 * 1024 : (size_t)1 << 30;
  if (half == 0 || half > max_half || rounds <= 0 || rounds > 100000000 || loops <= 0 || loops > 64 ||
      (argc > 4 && !tcp && strcmp(argv[4], "shm") != 0)) {
    fprintf(stderr, "usage: host_probe [bytes 2-2GiB, 2-256KiB with tcp] [rounds 1-1e8] [loops 1-64] [shm|tcp]\n");
    return 2;
  }
  alarm(60);
  struct sockaddr_in addr;
  const int listener = tcp ? tcp_listener(&addr) : -1;
  const size_t header = 4096;
  char* shared = mmap(NULL, header + 2 * half, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  char* mine = malloc(half);
  char* got = malloc(half);
  if (shared == MAP_FAILED || mine == NULL || got == NULL) {
    perror("host_probe");
    return 1;
  }
  _Atomic long* flags = (_Atomic long*)shared;
  const pid_t child = fork();
  if (child < 0) {
    perror("host_probe: fork");
    return 1;
  }
  const int rank = child == 0;
  if (rank == 1) {
    alarm(60);
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() == 1) return 1; /* the parent is gone already */
  }
  int conn = -1;
  if (tcp) {
    conn = rank == 1 ? socket(AF_INET, SOCK_STREAM, 0) : accept(listener, NULL, NULL);
    if (conn < 0 || (rank == 1 && connect(conn, (struct sockaddr*)&addr, sizeof addr) != 0)) {
      perror("host_probe: connect");
      return 1;
    }
    const int one = 1;
    setsockopt(conn, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  }
  char* box[2] = {shared + header, shared + header + half};
  memset(mine, rank + 1, half);
  double times[64];
  long seq = 0;
  for (int loop = 0; loop < loops; ++loop) {
    meet(flags, rank, 0, ++seq);
    const double start = now_us();
    for (int i = 0; i < 2 * rounds; ++i) {
      ++seq;
      if (tcp) {
        send_all(conn, mine, half);
        recv_all(conn, got, half);
        continue;
      }
      memcpy(box[rank], mine, half);
      meet(flags, rank, 0, seq);
      memcpy(got, box[1 - rank], half);
      meet(flags, rank, 1, seq);
    }
    times[loop] = (now_us() - start) / rounds;
  }
  if (rank == 1) return got[0] == 1 && got[half - 1] == 1 ? 0 : 1;
  int status = 0;
  waitpid(child, &status, 0);
  qsort(times, loops, sizeof times[0], by_value);
  printf("%.2f\n", times[loops / 2]);
  return WIFEXITED(status) && WEXITSTATUS(status) == 0 && got[0] == 2 && got[half - 1] == 2 ? 0 : 1;
}
