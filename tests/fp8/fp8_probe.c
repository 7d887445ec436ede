// fp8_probe.c: microgpt/fp8.h on the command line, for tests/fp8/test_fp8_numerics.py.
//   fp8_probe encode e4m3|e5m2   stdin float32[n] -> stdout uint8[n] codes
//   fp8_probe decode e4m3|e5m2   stdout float32[256]: every code decoded
//   fp8_probe scale  e4m3|e5m2   stdin float32[n] amaxes -> stdout int32[n] scale exponents
#include "../../microgpt/fp8.h"

#include <stdio.h>
#include <string.h>

int main(int argc, char **argv) {
    if (argc != 3) return 2;
    MgFp8Format f = strcmp(argv[2], "e4m3") == 0 ? MG_FP8_E4M3 : MG_FP8_E5M2;
    float x;
    if (strcmp(argv[1], "decode") == 0) {
        for (int c = 0; c < 256; c++) {
            x = mg_fp8_decode((uint8_t)c, f);
            fwrite(&x, 4, 1, stdout);
        }
        return 0;
    }
    int scale = strcmp(argv[1], "scale") == 0;
    while (fread(&x, 4, 1, stdin) == 1) {
        if (scale) {
            int k = mg_fp8_scale_exp(x, f);
            fwrite(&k, 4, 1, stdout);
        } else {
            uint8_t q = mg_fp8_encode(x, f);
            fwrite(&q, 1, 1, stdout);
        }
    }
    return 0;
}
