/* Reports what an MPI rank believes about locality: the size of its shared-memory communicator
 * (MPI_COMM_TYPE_SHARED, i.e. the ranks on its host), then checks an Allreduce over everyone. */
#include <mpi.h>
#include <stdio.h>

int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  int rank, size, local_size, local_rank;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  MPI_Comm local;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &local);
  MPI_Comm_size(local, &local_size);
  MPI_Comm_rank(local, &local_rank);
  int mine = rank + 1, sum = 0;
  MPI_Allreduce(&mine, &sum, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  printf("{\"rank\":%d,\"size\":%d,\"local_size\":%d,\"local_rank\":%d,\"sum\":%d,\"ok\":%s}\n", rank, size, local_size,
         local_rank, sum, sum == size * (size + 1) / 2 ? "true" : "false");
  fflush(stdout);
  MPI_Comm_free(&local);
  MPI_Finalize();
  return 0;
}
