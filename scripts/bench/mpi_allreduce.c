/* MPI_Allreduce bandwidth, float sum, out of place: the peer that
 * scripts/bench-host.sh measures next to ringcc's shared-memory ranks.
 * Usage: mpi_allreduce ITERS WARMUP BYTES [BYTES...] (WARMUP untimed calls
 * per size first, as nccl-tests' -w); rank 0 prints
 * "bytes time_us algbw_GBps busbw_GBps" per size (nccl-tests' busbw). */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int rank, ranks;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &ranks);
    int iters = argc > 1 ? atoi(argv[1]) : 10;
    int warmup = argc > 2 ? atoi(argv[2]) : 1;
    for (int a = 3; a < argc; a++) {
        size_t bytes = strtoull(argv[a], NULL, 10);
        size_t count = bytes / sizeof(float);
        float *in = malloc(count * sizeof(float) + 1), *out = malloc(count * sizeof(float) + 1);
        if (!in || !out) { fprintf(stderr, "out of memory\n"); MPI_Abort(MPI_COMM_WORLD, 1); }
        for (size_t i = 0; i < count; i++) in[i] = 1.0f;
        for (int k = 0; k < warmup; k++) /* untimed */
            MPI_Allreduce(in, out, (int)count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        MPI_Barrier(MPI_COMM_WORLD);
        double t0 = MPI_Wtime();
        for (int k = 0; k < iters; k++)
            MPI_Allreduce(in, out, (int)count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        double secs = (MPI_Wtime() - t0) / iters;
        if (rank == 0) {
            double algbw = (double)(count * sizeof(float)) / secs / 1e9;
            printf("%zu %.1f %.3f %.3f\n", count * sizeof(float), secs * 1e6, algbw,
                   algbw * 2.0 * (ranks - 1) / ranks);
        }
        free(in);
        free(out);
    }
    MPI_Finalize();
    return 0;
}
