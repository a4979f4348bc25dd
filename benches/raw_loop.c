/* The reference for benches/bench_ops.py: the same MPI calls jaxmpi makes, from a plain C
 * loop over the same library, in the same process. Returns seconds per call (best of the
 * loop, measured between barriers). */
#include <mpi.h>
#include <stdlib.h>

static MPI_Comm bench_comm = MPI_COMM_NULL;

static MPI_Comm comm(void) {
    if (bench_comm == MPI_COMM_NULL) MPI_Comm_dup(MPI_COMM_WORLD, &bench_comm);
    return bench_comm;
}

/* In place, as jaxmpi's allreduce works on a fori_loop carry. */
double raw_allreduce(float *buf, int count, int iters) {
    MPI_Barrier(comm());
    double t0 = MPI_Wtime();
    for (int i = 0; i < iters; i++)
        MPI_Allreduce(MPI_IN_PLACE, buf, count, MPI_FLOAT, MPI_SUM, comm());
    return (MPI_Wtime() - t0) / iters;
}

/* A ring shift: send to the right neighbour, receive from the left one. */
double raw_sendrecv(float *send, float *recv, int count, int iters) {
    int rank, size;
    MPI_Comm_rank(comm(), &rank);
    MPI_Comm_size(comm(), &size);
    int right = (rank + 1) % size, left = (rank + size - 1) % size;
    MPI_Barrier(comm());
    double t0 = MPI_Wtime();
    for (int i = 0; i < iters; i++)
        MPI_Sendrecv(send, count, MPI_FLOAT, right, 0, recv, count, MPI_FLOAT, left, 0, comm(),
                     MPI_STATUS_IGNORE);
    return (MPI_Wtime() - t0) / iters;
}
