/* An MPI program for tests/integration/ucx/ucx.sh: ranks 0 and 1 ping-pong messages of several
 * sizes (eager and rendezvous) and check every byte; then every rank sends a block to every
 * other (alltoall: each rank hears from all the others) and all ranks allreduce values that
 * depend on their rank, and both are checked. Prints one "ucx_mpi_check ok" line per rank on
 * success; any mismatch aborts the job with a non-zero status. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { kRounds = 20, kCount = 4 };

static void Fail(int rank, const char* what, long detail) {
  fprintf(stderr, "ucx_mpi_check rank %d: %s (%ld)\n", rank, what, detail);
  MPI_Abort(MPI_COMM_WORLD, 2);
}

static unsigned char Pattern(int round, size_t i, int from) {
  return (unsigned char)(round * 31 + i * 7 + from * 101);
}

/* Rank 0 sends, rank 1 checks and answers with its own pattern, rank 0 checks that. */
static void PingPong(int rank, size_t bytes) {
  unsigned char* buf = malloc(bytes);
  if (buf == NULL) Fail(rank, "out of memory", (long)bytes);
  for (int round = 0; round < kRounds; ++round) {
    const int me = rank;
    const int peer = 1 - rank;
    if (rank == 0) {
      for (size_t i = 0; i < bytes; ++i) buf[i] = Pattern(round, i, me);
      MPI_Send(buf, (int)bytes, MPI_BYTE, peer, round, MPI_COMM_WORLD);
    }
    MPI_Recv(buf, (int)bytes, MPI_BYTE, peer, round, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    for (size_t i = 0; i < bytes; ++i) {
      if (buf[i] != Pattern(round, i, peer)) Fail(rank, "wrong byte received at", (long)i);
    }
    if (rank == 1) {
      for (size_t i = 0; i < bytes; ++i) buf[i] = Pattern(round, i, me);
      MPI_Send(buf, (int)bytes, MPI_BYTE, peer, round, MPI_COMM_WORLD);
    }
  }
  free(buf);
}

/* Every rank sends kCount values to every rank, each naming sender, receiver and index. */
static void AllToAll(int rank, int size) {
  long* out = malloc(sizeof(long) * kCount * size);
  long* in = malloc(sizeof(long) * kCount * size);
  if (out == NULL || in == NULL) Fail(rank, "out of memory", (long)size);
  for (int to = 0; to < size; ++to)
    for (int i = 0; i < kCount; ++i) out[to * kCount + i] = ((long)rank << 32) | (to << 8) | i;
  MPI_Alltoall(out, kCount, MPI_LONG, in, kCount, MPI_LONG, MPI_COMM_WORLD);
  for (int from = 0; from < size; ++from)
    for (int i = 0; i < kCount; ++i)
      if (in[from * kCount + i] != (((long)from << 32) | (rank << 8) | i))
        Fail(rank, "wrong alltoall block from rank", from);
  free(out);
  free(in);
}

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0;
  int size = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  if (size < 2) Fail(rank, "needs at least 2 ranks, got", size);
  const size_t sizes[] = {8, 4096, 65536, 1 << 20};
  for (size_t s = 0; s < sizeof(sizes) / sizeof(sizes[0]) && rank < 2; ++s)
    PingPong(rank, sizes[s]);
  AllToAll(rank, size);
  long in[kCount];
  long out[kCount];
  for (int i = 0; i < kCount; ++i) in[i] = (long)(rank + 1) * (i + 1) * 1000 + rank;
  MPI_Allreduce(in, out, kCount, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
  for (int i = 0; i < kCount; ++i) {
    long want = 0;
    for (int r = 0; r < size; ++r) want += (long)(r + 1) * (i + 1) * 1000 + r;
    if (out[i] != want) Fail(rank, "wrong allreduce sum at", i);
  }
  char host[MPI_MAX_PROCESSOR_NAME];
  int len = 0;
  MPI_Get_processor_name(host, &len);
  printf("ucx_mpi_check ok rank %d of %d on %s: %d round trips, allreduce %ld\n", rank, size, host,
         rank < 2 ? kRounds * 4 : 0, out[kCount - 1]);
  MPI_Finalize();
  return 0;
}
