// cuda/cudnn_loader.h: cuDNN (and the NVRTC the cudnn-frontend refers to)
// loaded at run time, so that a binary built with cuDNN starts on a machine
// without it and runs the other attention paths.
//
// The binary does not link libcudnn or libnvrtc (`readelf -d` lists neither):
// cudnn_loader.cpp defines every cuDNN and NVRTC function that
// attention_cudnn.o calls, each forwarding to the function of that name in
// the library loaded here. The engine calls cudnn_library_load before it
// builds cuDNN's attention graphs; a failure is one line naming the library
// and the loader's error (docs/CUDA.md, "Building").
#ifndef MICROGPT_CUDA_CUDNN_LOADER_H
#define MICROGPT_CUDA_CUDNN_LOADER_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

// Loads libcudnn.so.<the major of the cudnn.h it was compiled against> by
// its soname, so LD_LIBRARY_PATH and then the binary's rpath (the directory
// make found cuDNN in: glibc searches the DT_RUNPATH of the object that calls
// dlopen, here the engine itself) find it; and resolves every function the
// forwarders need. Once per process: later calls return the first call's
// answer. 1, or 0 with "cuDNN not loaded: <dlerror's line>" in why[why_len],
// e.g. "cuDNN not loaded: libcudnn.so.9: cannot open shared object file: No
// such file or directory".
int cudnn_library_load(char *why, size_t why_len);

#ifdef __cplusplus
}
#endif

#endif  // MICROGPT_CUDA_CUDNN_LOADER_H
