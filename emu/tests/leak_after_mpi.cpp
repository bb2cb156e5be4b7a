/*
 * A program that initializes and finalizes MPI as the trainer does and, when asked, leaks 4321 bytes
 * of its own (dev/test/test_emu_libs.py): linked with emu/sanitizer_defaults.cpp, its run must exit 0
 * without leaking, and report exactly its own leak (not Open MPI's) when it does.
 * Usage: leak_after_mpi [leak]
 */
#include <mpi.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>

static void* volatile g_kept;

int main(int argc, char** argv) {
    MPI_Init(&argc, &argv);
    int rank = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    int sum = 0, one = 1;
    MPI_Allreduce(&one, &sum, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    if (argc > 1 && strcmp(argv[1], "leak") == 0) {
        g_kept = malloc(4321);
        g_kept = nullptr; /* the only pointer gone: a leak LeakSanitizer must see */
    }
    MPI_Finalize();
    printf("rank %d sum %d\n", rank, sum);
    return 0;
}
