/* Calls libmlp.so (examples/aot/mlp.py exported with `tessera aot`) from C.
 *   mlp_demo                      random inputs; prints the first outputs
 *   mlp_demo x.bin w.bin b.bin y.bin
 *                                 reads the inputs (raw float32, the header's sizes), writes y */
#include <stdio.h>
#include <stdlib.h>
#include "mlp.h"

static int read_all(const char *path, float *dst, size_t n) {
    FILE *f = fopen(path, "rb");
    if (!f) return -1;
    size_t got = fread(dst, sizeof(float), n, f);
    fclose(f);
    return got == n ? 0 : -1;
}

int main(int argc, char **argv) {
    static float x[MLP_IN0_NUMEL], w[MLP_IN1_NUMEL], b[MLP_IN2_NUMEL], y[MLP_OUT0_NUMEL];
    float *ins[3] = {x, w, b};
    size_t sizes[3] = {MLP_IN0_NUMEL, MLP_IN1_NUMEL, MLP_IN2_NUMEL};
    if (argc == 5) {
        for (int i = 0; i < 3; i++)
            if (read_all(argv[i + 1], ins[i], sizes[i]) != 0) {
                fprintf(stderr, "cannot read %zu floats from %s\n", sizes[i], argv[i + 1]);
                return 2;
            }
    } else {
        srand(1);
        for (int i = 0; i < 3; i++)
            for (size_t j = 0; j < sizes[i]; j++) ins[i][j] = (float)rand() / RAND_MAX - 0.5f;
    }
    int rc = mlp(x, w, b, y);
    if (rc != MLP_OK) {
        fprintf(stderr, "mlp: %s\n", mlp_strerror(rc));
        return 1;
    }
    printf("mlp: y[%d][%d] on %s, first: %g %g %g\n", MLP_OUT0_DIM0, MLP_OUT0_DIM1, MLP_CPU, y[0], y[1], y[2]);
    if (argc == 5) {
        FILE *f = fopen(argv[4], "wb");
        if (!f || fwrite(y, sizeof(float), MLP_OUT0_NUMEL, f) != MLP_OUT0_NUMEL) return 3;
        fclose(f);
    }
    return 0;
}
