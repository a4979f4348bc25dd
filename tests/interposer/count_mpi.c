/* A PMPI interposer, as mpiP, Score-P and TAU are one: it defines MPI functions, counts
 * each call and forwards it to the MPI library's PMPI_ entry. tests/interposer_jobs.sh
 * builds it with each MPI's mpicc and puts it in front of the MPI library with LD_PRELOAD
 * through the launcher; jaxmpi must then call these definitions (docs/guides/profiling.md
 * says when it does).
 *
 * At MPI_Finalize (or, if no MPI_Finalize came through here, at exit) each rank writes
 * "<function> <calls>" lines to $COUNT_MPI_OUT.<this file's name>.<rank>.
 * count_mpi_calls(name) reads a counter from the process itself: the job also loads copies
 * (files of other names) that must never be called.
 *
 *   mpicc -shared -fPIC -o libcount_mpi.so count_mpi.c
 *
 * Built against the mpi.h of the MPI it runs with: the prototypes and handle types are
 * that family's. MPI_Init_thread is defined too, as every profiling tool defines it: jaxmpi
 * must still take the library, not the tool, as the MPI it loads. MPI_Test_completing is no
 * function: it counts the MPI_Test calls that found their request complete (how many tests
 * a request takes depends on timing; that one completes it, or MPI_Wait does, does not). */
#define _GNU_SOURCE /* dladdr */
#include <dlfcn.h>
#include <libgen.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define COUNTED(X)                                                                         \
    X(MPI_Init_thread)                                                                     \
    X(MPI_Finalize)                                                                        \
    X(MPI_Barrier)                                                                         \
    X(MPI_Allreduce)                                                                       \
    X(MPI_Iallreduce)                                                                      \
    X(MPI_Bcast)                                                                           \
    X(MPI_Allgather)                                                                       \
    X(MPI_Sendrecv)                                                                        \
    X(MPI_Sendrecv_replace)                                                                \
    X(MPI_Isend)                                                                           \
    X(MPI_Irecv)                                                                           \
    X(MPI_Wait)                                                                            \
    X(MPI_Test)                                                                            \
    X(MPI_Test_completing)                                                                 \
    X(MPI_Comm_split)                                                                      \
    X(MPI_Comm_dup)                                                                        \
    X(MPI_Comm_free)                                                                       \
    X(MPI_Reduce_local)

#define ENUM(name) COUNT_##name,
enum { COUNTED(ENUM) COUNTED_FUNCTIONS };
#define NAME(name) #name,
static const char *const names[] = {COUNTED(NAME)};
static unsigned long counts[COUNTED_FUNCTIONS];
static int written;

#define COUNT(name) __atomic_fetch_add(&counts[COUNT_##name], 1, __ATOMIC_RELAXED)

/* The names of the functions counted here, separated by spaces. */
const char *count_mpi_functions(void) {
#define LISTED(name) #name " "
    return COUNTED(LISTED);
}

/* The calls of `name` so far in this process; -1 for a function not counted here. */
long count_mpi_calls(const char *name) {
    for (int i = 0; i < COUNTED_FUNCTIONS; i++)
        if (strcmp(names[i], name) == 0)
            return (long)__atomic_load_n(&counts[i], __ATOMIC_RELAXED);
    return -1;
}

/* An address inside this very file (a static function: no other copy's can stand in). */
static void here(void) {}

static void write_counts(int rank, const char *when) {
    const char *out = getenv("COUNT_MPI_OUT");
    if (written || out == NULL || *out == '\0')
        return;
    written = 1;
    Dl_info self;
    char own[4096] = "count_mpi", path[4096];
    if (dladdr((void *)here, &self) != 0 && self.dli_fname != NULL)
        snprintf(own, sizeof own, "%s", self.dli_fname);
    snprintf(path, sizeof path, "%s.%s.%d", out, basename(own), rank);
    FILE *file = fopen(path, "w");
    if (file == NULL) {
        perror(path);
        return;
    }
    fprintf(file, "# rank %d, written %s\n", rank, when);
    for (int i = 0; i < COUNTED_FUNCTIONS; i++)
        fprintf(file, "%s %lu\n", names[i], __atomic_load_n(&counts[i], __ATOMIC_RELAXED));
    fclose(file);
}

static int env_rank(void) {
    const char *vars[] = {"PMI_RANK", "OMPI_COMM_WORLD_RANK"};
    for (int i = 0; i < 2; i++)
        if (getenv(vars[i]) != NULL)
            return atoi(getenv(vars[i]));
    return 0;
}

__attribute__((destructor)) static void at_exit(void) { write_counts(env_rank(), "at exit"); }

int MPI_Init_thread(int *argc, char ***argv, int required, int *provided) {
    COUNT(MPI_Init_thread);
    return PMPI_Init_thread(argc, argv, required, provided);
}

int MPI_Finalize(void) {
    COUNT(MPI_Finalize);
    int rank = env_rank();
    PMPI_Comm_rank(MPI_COMM_WORLD, &rank);
    write_counts(rank, "at MPI_Finalize");
    return PMPI_Finalize();
}

int MPI_Barrier(MPI_Comm comm) {
    COUNT(MPI_Barrier);
    return PMPI_Barrier(comm);
}

int MPI_Allreduce(const void *sendbuf, void *recvbuf, int count, MPI_Datatype datatype,
                  MPI_Op op, MPI_Comm comm) {
    COUNT(MPI_Allreduce);
    return PMPI_Allreduce(sendbuf, recvbuf, count, datatype, op, comm);
}

int MPI_Iallreduce(const void *sendbuf, void *recvbuf, int count, MPI_Datatype datatype,
                   MPI_Op op, MPI_Comm comm, MPI_Request *request) {
    COUNT(MPI_Iallreduce);
    return PMPI_Iallreduce(sendbuf, recvbuf, count, datatype, op, comm, request);
}

int MPI_Bcast(void *buffer, int count, MPI_Datatype datatype, int root, MPI_Comm comm) {
    COUNT(MPI_Bcast);
    return PMPI_Bcast(buffer, count, datatype, root, comm);
}

int MPI_Allgather(const void *sendbuf, int sendcount, MPI_Datatype sendtype, void *recvbuf,
                  int recvcount, MPI_Datatype recvtype, MPI_Comm comm) {
    COUNT(MPI_Allgather);
    return PMPI_Allgather(sendbuf, sendcount, sendtype, recvbuf, recvcount, recvtype, comm);
}

int MPI_Sendrecv(const void *sendbuf, int sendcount, MPI_Datatype sendtype, int dest,
                 int sendtag, void *recvbuf, int recvcount, MPI_Datatype recvtype, int source,
                 int recvtag, MPI_Comm comm, MPI_Status *status) {
    COUNT(MPI_Sendrecv);
    return PMPI_Sendrecv(sendbuf, sendcount, sendtype, dest, sendtag, recvbuf, recvcount,
                         recvtype, source, recvtag, comm, status);
}

int MPI_Sendrecv_replace(void *buf, int count, MPI_Datatype datatype, int dest, int sendtag,
                         int source, int recvtag, MPI_Comm comm, MPI_Status *status) {
    COUNT(MPI_Sendrecv_replace);
    return PMPI_Sendrecv_replace(buf, count, datatype, dest, sendtag, source, recvtag, comm,
                                 status);
}

int MPI_Isend(const void *buf, int count, MPI_Datatype datatype, int dest, int tag,
              MPI_Comm comm, MPI_Request *request) {
    COUNT(MPI_Isend);
    return PMPI_Isend(buf, count, datatype, dest, tag, comm, request);
}

int MPI_Irecv(void *buf, int count, MPI_Datatype datatype, int source, int tag, MPI_Comm comm,
              MPI_Request *request) {
    COUNT(MPI_Irecv);
    return PMPI_Irecv(buf, count, datatype, source, tag, comm, request);
}

int MPI_Wait(MPI_Request *request, MPI_Status *status) {
    COUNT(MPI_Wait);
    return PMPI_Wait(request, status);
}

int MPI_Test(MPI_Request *request, int *flag, MPI_Status *status) {
    COUNT(MPI_Test);
    int rc = PMPI_Test(request, flag, status);
    if (rc == MPI_SUCCESS && *flag)
        COUNT(MPI_Test_completing);
    return rc;
}

int MPI_Comm_split(MPI_Comm comm, int color, int key, MPI_Comm *newcomm) {
    COUNT(MPI_Comm_split);
    return PMPI_Comm_split(comm, color, key, newcomm);
}

int MPI_Comm_dup(MPI_Comm comm, MPI_Comm *newcomm) {
    COUNT(MPI_Comm_dup);
    return PMPI_Comm_dup(comm, newcomm);
}

int MPI_Comm_free(MPI_Comm *comm) {
    COUNT(MPI_Comm_free);
    return PMPI_Comm_free(comm);
}

int MPI_Reduce_local(const void *inbuf, void *inoutbuf, int count, MPI_Datatype datatype,
                     MPI_Op op) {
    COUNT(MPI_Reduce_local);
    return PMPI_Reduce_local(inbuf, inoutbuf, count, datatype, op);
}
