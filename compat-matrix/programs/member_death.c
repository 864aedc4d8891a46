/* member-death: ranks loop on Allreduce until the runner SIGKILLs one of them; the others must
 * end (error or killed) within 2 s. */
#include "compat.h"

int main(int argc, char **argv) {
  const char *F = "member-death";
  MPI_Init(&argc, &argv);
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  int rank, size;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  compat_report(F, rank, size, 1, "\"looping\":true");
  for (long i = 0;; i++) {
    int one = 1, sum = 0;
    int rc = MPI_Allreduce(&one, &sum, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    if (rc != MPI_SUCCESS) {
      compat_report(F, rank, size, 1, "\"iteration\":%ld,\"rc\":%d", i, rc);
      return 8;
    }
    usleep(10 * 1000);
  }
}
