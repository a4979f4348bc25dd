/* The reference for benches/bench_ops.py: the MPI call each op makes, from a plain C loop
 * over the same library, in the same process (MPI initialized by mpi4py, asking for
 * MPI_THREAD_MULTIPLE). raw_run returns the seconds the loop took on this rank, started
 * right after a barrier; bench_ops.py takes the slowest rank.
 *
 * Buffers and counts are those of bench_ops.py's jitted loops: `count` float32 elements
 * per rank (alltoall: `count` per destination block), reductions in place (as jaxmpi's run
 * on a loop carry), rooted ops at rank 0, sendrecv a ring shift (from x into y; in place
 * in x with MPI_Sendrecv_replace for sendrecv_replace), send/recv pairs (0, 1), (2, 3),
 * ... each sending then receiving (even ranks) or the reverse (odd). */
#include <mpi.h>
#include <stddef.h>

enum {
    OP_ALLREDUCE,
    OP_REDUCE,
    OP_SCAN,
    OP_BCAST,
    OP_GATHER,
    OP_ALLGATHER,
    OP_SCATTER,
    OP_ALLTOALL,
    OP_SENDRECV,
    OP_SEND_RECV,
    OP_SENDRECV_REPLACE,
    OP_BARRIER,
};

static MPI_Comm bench_comm = MPI_COMM_NULL;

static MPI_Comm comm(void) {
    if (bench_comm == MPI_COMM_NULL) MPI_Comm_dup(MPI_COMM_WORLD, &bench_comm);
    return bench_comm;
}

/* One call of `op`; x is the input (count elements, size * count for a root's scatter or
 * an alltoall), y the output (size * count at a gather's root and for allgather and
 * alltoall, count otherwise). */
static int call(int op, float *x, float *y, int count, int rank, int size) {
    MPI_Comm c = comm();
    int partner = rank ^ 1;
    switch (op) {
    case OP_ALLREDUCE:
        return MPI_Allreduce(MPI_IN_PLACE, x, count, MPI_FLOAT, MPI_SUM, c);
    case OP_REDUCE:
        return rank == 0 ? MPI_Reduce(MPI_IN_PLACE, x, count, MPI_FLOAT, MPI_SUM, 0, c)
                         : MPI_Reduce(x, NULL, count, MPI_FLOAT, MPI_SUM, 0, c);
    case OP_SCAN:
        return MPI_Scan(MPI_IN_PLACE, x, count, MPI_FLOAT, MPI_SUM, c);
    case OP_BCAST:
        return MPI_Bcast(x, count, MPI_FLOAT, 0, c);
    case OP_GATHER:
        return MPI_Gather(x, count, MPI_FLOAT, y, count, MPI_FLOAT, 0, c);
    case OP_ALLGATHER:
        return MPI_Allgather(x, count, MPI_FLOAT, y, count, MPI_FLOAT, c);
    case OP_SCATTER:
        return MPI_Scatter(x, count, MPI_FLOAT, y, count, MPI_FLOAT, 0, c);
    case OP_ALLTOALL:
        return MPI_Alltoall(x, count, MPI_FLOAT, y, count, MPI_FLOAT, c);
    case OP_SENDRECV:
        return MPI_Sendrecv(x, count, MPI_FLOAT, (rank + 1) % size, 0, y, count, MPI_FLOAT,
                            (rank + size - 1) % size, 0, c, MPI_STATUS_IGNORE);
    case OP_SEND_RECV:
        if (partner >= size) return MPI_SUCCESS;
        if (rank % 2 == 0) {
            MPI_Send(x, count, MPI_FLOAT, partner, 0, c);
            return MPI_Recv(y, count, MPI_FLOAT, partner, 0, c, MPI_STATUS_IGNORE);
        }
        MPI_Recv(y, count, MPI_FLOAT, partner, 0, c, MPI_STATUS_IGNORE);
        return MPI_Send(x, count, MPI_FLOAT, partner, 0, c);
    case OP_SENDRECV_REPLACE:
        return MPI_Sendrecv_replace(x, count, MPI_FLOAT, (rank + 1) % size, 0,
                                    (rank + size - 1) % size, 0, c, MPI_STATUS_IGNORE);
    case OP_BARRIER:
        return MPI_Barrier(c);
    }
    return MPI_ERR_OTHER;
}

/* Seconds for `iters` calls on this rank, after a barrier; negative on an MPI error. */
double raw_run(int op, float *x, float *y, int count, int iters) {
    int rank, size;
    MPI_Comm_rank(comm(), &rank);
    MPI_Comm_size(comm(), &size);
    MPI_Barrier(comm());
    double t0 = MPI_Wtime();
    for (int i = 0; i < iters; i++)
        if (call(op, x, y, count, rank, size) != MPI_SUCCESS) return -1.0;
    return MPI_Wtime() - t0;
}

/* What the Python side times with: a barrier, and the slowest rank's value. */
void raw_barrier(void) { MPI_Barrier(comm()); }

double raw_max(double value) {
    double max;
    MPI_Allreduce(&value, &max, 1, MPI_DOUBLE, MPI_MAX, comm());
    return max;
}

/* The thread level MPI was initialized with (3 = MPI_THREAD_MULTIPLE in MPICH). */
int raw_thread_level(void) {
    int provided;
    MPI_Query_thread(&provided);
    return provided == MPI_THREAD_MULTIPLE ? 3 : provided == MPI_THREAD_SERIALIZED ? 2
         : provided == MPI_THREAD_FUNNELED ? 1 : 0;
}
