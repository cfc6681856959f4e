// Times MPI_Allgatherv of n/L floats per rank against the direct exchange (every shard straight
// to every other rank, all at once) among L ranks on shared memory; median of 15 after 3.
#include <algorithm>
#include <cstdio>
#include <mpi.h>
#include <vector>
int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int r, L;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  MPI_Comm_size(MPI_COMM_WORLD, &L);
  const long n = 1L << 24;
  std::vector<int> counts(L), displs(L);
  for (int s = 0; s < L; ++s) {
    displs[s] = int(s * n / L);
    counts[s] = int((s + 1) * n / L - displs[s]);
  }
  std::vector<float> shard(counts[r], 1.0f), out(n);
  for (int method = 0; method < 2; ++method) {
    std::vector<double> t;
    for (int it = 0; it < 18; ++it) {
      MPI_Barrier(MPI_COMM_WORLD);
      double t0 = MPI_Wtime();
      if (method == 0) {
        MPI_Allgatherv(shard.data(), counts[r], MPI_FLOAT, out.data(), counts.data(), displs.data(),
                       MPI_FLOAT, MPI_COMM_WORLD);
      } else {
        std::vector<MPI_Request> q;
        for (int s = 0; s < L; ++s)
          if (s != r) {
            q.emplace_back();
            MPI_Irecv(out.data() + displs[s], counts[s], MPI_FLOAT, s, 1, MPI_COMM_WORLD,
                      &q.back());
          }
        for (int s = 0; s < L; ++s)
          if (s != r) {
            q.emplace_back();
            MPI_Isend(shard.data(), counts[r], MPI_FLOAT, s, 1, MPI_COMM_WORLD, &q.back());
          }
        MPI_Waitall(int(q.size()), q.data(), MPI_STATUSES_IGNORE);
        std::copy(shard.begin(), shard.end(), out.begin() + displs[r]);
      }
      double dt = MPI_Wtime() - t0, mx;
      MPI_Allreduce(&dt, &mx, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
      if (it >= 3) t.push_back(mx);
    }
    std::sort(t.begin(), t.end());
    if (r == 0)
      std::printf("L=%d %s median %.4f s (min %.4f, max %.4f)\n", L,
                  method ? "direct" : "MPI_Allgatherv", t[t.size() / 2], t.front(), t.back());
  }
  MPI_Finalize();
}
