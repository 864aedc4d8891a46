/* A C library that takes its communicator from Python as mpi4py hands it over: a Fortran handle
 * (MPI.Comm.py2f) or the C handle itself (MPI._handleof). */
#include <mpi.h>

int lib_sum_of_ranks_f(MPI_Fint fcomm, int *size) {
  MPI_Comm comm = MPI_Comm_f2c(fcomm);
  int rank = -1, sum = -1;
  if (MPI_Comm_size(comm, size) != MPI_SUCCESS || MPI_Comm_rank(comm, &rank) != MPI_SUCCESS) return -1;
  if (MPI_Allreduce(&rank, &sum, 1, MPI_INT, MPI_SUM, comm) != MPI_SUCCESS) return -1;
  return sum;
}

int lib_compare(MPI_Comm comm, MPI_Fint fcomm) {
  int result = -1;
  MPI_Comm_compare(comm, MPI_Comm_f2c(fcomm), &result);
  return result == MPI_IDENT;
}
