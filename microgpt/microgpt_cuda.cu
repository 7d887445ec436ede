// microgpt_cuda.cu: the GPU engine. Placeholder until the CUDA engine issue
// lands: it exists so the build target and the proxy's engine selection are
// real, and it refuses to train rather than pretend.
#include <cstdio>
int main(void) {
    std::fprintf(stderr, "microgpt_cuda: error: the CUDA engine is not built yet; use microgpt_cpu\n");
    return 2;
}
