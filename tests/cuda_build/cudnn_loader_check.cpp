// The run-time loader of cuDNN and NVRTC (microgpt/cuda/cudnn_loader.cpp), driven
// on the CPU by tests/cuda_build/test_cudnn_loader.py: nothing here needs a GPU.
//
//   cudnn_loader_check cudnn   cudnn_library_load; loaded: cuDNN's version and an
//                              error string through the forwarders (exit 0); not
//                              loaded: its one line (exit 3)
//   cudnn_loader_check nvrtc   NVRTC compiles a one-line kernel to a cubin through
//                              the forwarders (exit 0), or prints the result code
//                              they returned (exit 4)
//   cudnn_loader_check early   a cuDNN function before cudnn_library_load (aborts)
#include "cudnn_loader.h"

#include <cudnn.h>
#include <nvrtc.h>
#include <stdio.h>
#include <string.h>

static int check_cudnn(void) {
    char why[512] = "";
    if (!cudnn_library_load(why, sizeof why)) {
        printf("%s\n", why);
        char again[512] = "";  // a second call gives the first call's answer
        return cudnn_library_load(again, sizeof again) || strcmp(why, again) ? 5 : 3;
    }
    printf("loaded cuDNN %zu, compiled against %d: %s\n", cudnnGetVersion(), CUDNN_VERSION,
           cudnnGetErrorString(CUDNN_STATUS_BAD_PARAM));
    return 0;
}

static int check_nvrtc(void) {
    const char *source = "extern \"C\" __global__ void k(float *x) { x[threadIdx.x] *= 2.0f; }";
    const char *options[] = {"--gpu-architecture=sm_90"};
    nvrtcProgram program;
    size_t cubin = 0;
    nvrtcResult r = nvrtcCreateProgram(&program, source, "k.cu", 0, NULL, NULL);
    if (r == NVRTC_SUCCESS) {
        r = nvrtcCompileProgram(program, 1, options);
        if (r == NVRTC_SUCCESS) r = nvrtcGetCUBINSize(program, &cubin);
        nvrtcDestroyProgram(&program);
    }
    if (r != NVRTC_SUCCESS) {
        printf("nvrtc result %d\n", (int)r);
        return 4;
    }
    printf("nvrtc cubin of %zu bytes\n", cubin);
    return 0;
}

int main(int argc, char **argv) {
    const char *what = argc > 1 ? argv[1] : "";
    if (strcmp(what, "cudnn") == 0) return check_cudnn();
    if (strcmp(what, "nvrtc") == 0) return check_nvrtc();
    if (strcmp(what, "early") == 0) return (int)cudnnGetVersion() & 1;
    fprintf(stderr, "usage: cudnn_loader_check cudnn|nvrtc|early\n");
    return 2;
}
