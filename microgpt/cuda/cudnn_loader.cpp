// cuda/cudnn_loader.cpp: the cuDNN and NVRTC functions attention_cudnn.o
// calls, defined here as forwarders to the libraries loaded at run time
// (cudnn_loader.h says why).
//
// Why forwarders and not cudnn-frontend's own dynamic loading
// (NV_CUDNN_FRONTEND_USE_DYNAMIC_LOADING): that mode also reaches the CUDA
// runtime through dlopen("libcudart.so.12" / ".13"), a second runtime beside
// the one this binary links statically, and the cuDNN wheel ships none. Here
// only cuDNN and NVRTC move to run time; the frontend's CUDA runtime calls
// stay on the binary's own runtime.
//
// Each forwarder is defined with its parameter list written out, after
// cudnn.h and nvrtc.h declared it: a list that disagrees with the header is a
// compile error, and a function attention_cudnn.o needs and this file lacks
// is an undefined symbol at link time (the binary links neither library).
#include "cudnn_loader.h"

#include <cudnn.h>
#include <dlfcn.h>
#include <nvrtc.h>
#include <stdio.h>
#include <stdlib.h>

#include <mutex>

// The cuDNN functions: (return type, name, parameter list, argument list).
#define MG_CUDNN_FUNCTIONS(X)                                                                                     \
    X(cudnnStatus_t, cudnnCreate, (cudnnHandle_t * handle), (handle))                                            \
    X(cudnnStatus_t, cudnnDestroy, (cudnnHandle_t handle), (handle))                                             \
    X(cudnnStatus_t, cudnnSetStream, (cudnnHandle_t handle, cudaStream_t streamId), (handle, streamId))          \
    X(cudnnStatus_t, cudnnGetStream, (cudnnHandle_t handle, cudaStream_t * streamId), (handle, streamId))        \
    X(size_t, cudnnGetVersion, (void), ())                                                                        \
    X(const char *, cudnnGetErrorString, (cudnnStatus_t status), (status))                                       \
    X(void, cudnnGetLastErrorString, (char *message, size_t max_size), (message, max_size))                      \
    X(cudnnStatus_t, cudnnBackendCreateDescriptor,                                                                \
      (cudnnBackendDescriptorType_t descriptorType, cudnnBackendDescriptor_t * descriptor),                       \
      (descriptorType, descriptor))                                                                               \
    X(cudnnStatus_t, cudnnBackendDestroyDescriptor, (cudnnBackendDescriptor_t descriptor), (descriptor))         \
    X(cudnnStatus_t, cudnnBackendFinalize, (cudnnBackendDescriptor_t descriptor), (descriptor))                  \
    X(cudnnStatus_t, cudnnBackendSetAttribute,                                                                    \
      (cudnnBackendDescriptor_t descriptor, cudnnBackendAttributeName_t attributeName,                            \
       cudnnBackendAttributeType_t attributeType, int64_t elementCount, const void *arrayOfElements),             \
      (descriptor, attributeName, attributeType, elementCount, arrayOfElements))                                  \
    X(cudnnStatus_t, cudnnBackendGetAttribute,                                                                    \
      (cudnnBackendDescriptor_t const descriptor, cudnnBackendAttributeName_t attributeName,                      \
       cudnnBackendAttributeType_t attributeType, int64_t requestedElementCount, int64_t *elementCount,           \
       void *arrayOfElements),                                                                                    \
      (descriptor, attributeName, attributeType, requestedElementCount, elementCount, arrayOfElements))           \
    X(cudnnStatus_t, cudnnBackendExecute,                                                                         \
      (cudnnHandle_t handle, cudnnBackendDescriptor_t executionPlan, cudnnBackendDescriptor_t variantPack),       \
      (handle, executionPlan, variantPack))                                                                       \
    MG_CUDNN_FUNCTIONS_SINCE_9_23(X)

// cuDNN 9.23 added cudnnGetExecutionPlanWorkspaceSize; the frontend calls it only when built against 9.23 or
// later (CUDNN_VERSION >= 92300), so older headers (9.19 on the GPU image) neither declare nor need it.
#if CUDNN_VERSION >= 92300
#define MG_CUDNN_FUNCTIONS_SINCE_9_23(X)                                                                          \
    X(cudnnStatus_t, cudnnGetExecutionPlanWorkspaceSize,                                                          \
      (cudnnHandle_t handle, cudnnBackendDescriptor_t executionPlan, cudnnBackendDescriptor_t variantPack,        \
       size_t *workspaceSizeInBytes),                                                                             \
      (handle, executionPlan, variantPack, workspaceSizeInBytes))
#else
#define MG_CUDNN_FUNCTIONS_SINCE_9_23(X)
#endif

// The NVRTC functions the frontend refers to. Only its sm100 RMSNorm+SiLU
// engine calls them, never the attention graphs; NVRTC is loaded at the first
// call, and where it cannot be, each returns NVRTC_ERROR_INTERNAL_ERROR
// (after one line saying why), which the frontend reports as that engine's
// failure. (cuDNN's own runtime-compiled engines load NVRTC themselves.)
#define MG_NVRTC_FUNCTIONS(X)                                                                                     \
    X(nvrtcResult, nvrtcCreateProgram,                                                                            \
      (nvrtcProgram * prog, const char *src, const char *name, int numHeaders, const char *const *headers,        \
       const char *const *includeNames),                                                                          \
      (prog, src, name, numHeaders, headers, includeNames))                                                       \
    X(nvrtcResult, nvrtcDestroyProgram, (nvrtcProgram * prog), (prog))                                           \
    X(nvrtcResult, nvrtcCompileProgram, (nvrtcProgram prog, int numOptions, const char *const *options),         \
      (prog, numOptions, options))                                                                                \
    X(nvrtcResult, nvrtcGetProgramLogSize, (nvrtcProgram prog, size_t *logSizeRet), (prog, logSizeRet))          \
    X(nvrtcResult, nvrtcGetProgramLog, (nvrtcProgram prog, char *log), (prog, log))                              \
    X(nvrtcResult, nvrtcGetCUBINSize, (nvrtcProgram prog, size_t *cubinSizeRet), (prog, cubinSizeRet))           \
    X(nvrtcResult, nvrtcGetCUBIN, (nvrtcProgram prog, char *cubin), (prog, cubin))

#define MG_STRINGIFY(x) #x
#define MG_SONAME(stem, major) stem MG_STRINGIFY(major)

// One library: its soname, and the address of each function once loaded.
namespace {

#define MG_POINTER(ret, name, params, args) decltype(&::name) name = nullptr;
struct CudnnFunctions {
    MG_CUDNN_FUNCTIONS(MG_POINTER)
};
struct NvrtcFunctions {
    MG_NVRTC_FUNCTIONS(MG_POINTER)
};
#undef MG_POINTER

CudnnFunctions cudnn;
NvrtcFunctions nvrtc;
std::mutex load_lock;

// dlopen `soname`, then `resolve` looks up each function (it returns the
// name of the first one missing, or null). On failure "<what> not loaded:
// <dlerror's line, which names the file>" in why, and the library closed
// again. RTLD_LOCAL: nothing of it serves any other symbol lookup.
template <typename Resolve>
bool load(const char *what, const char *soname, Resolve resolve, char *why, size_t why_len) {
    void *handle = dlopen(soname, RTLD_NOW | RTLD_LOCAL);
    if (!handle) {
        snprintf(why, why_len, "%s not loaded: %s", what, dlerror());
        return false;
    }
    const char *missing = resolve(handle);
    if (missing) {
        snprintf(why, why_len, "%s not loaded: %s has no %s (%s)", what, soname, missing, dlerror());
        dlclose(handle);
        return false;
    }
    return true;
}

#define MG_RESOLVE(ret, name, params, args) \
    if (!(table.name = reinterpret_cast<decltype(table.name)>(dlsym(handle, #name)))) return #name;

const char *resolve_cudnn(void *handle) {
    CudnnFunctions table;
    MG_CUDNN_FUNCTIONS(MG_RESOLVE)
    cudnn = table;
    return nullptr;
}

const char *resolve_nvrtc(void *handle) {
    NvrtcFunctions table;
    MG_NVRTC_FUNCTIONS(MG_RESOLVE)
    nvrtc = table;
    return nullptr;
}
#undef MG_RESOLVE

// libnvrtc.so.<the CUDA major this was compiled for>: NVRTC's soname carries
// the toolkit's major (13000 -> 13).
bool nvrtc_load(void) {
    static int state = 0;  // 0 not tried, 1 loaded, -1 failed
    std::lock_guard<std::mutex> guard(load_lock);
    if (state == 0) {
        char soname[32], why[512];
        snprintf(soname, sizeof soname, "libnvrtc.so.%d", CUDART_VERSION / 1000);
        state = load("NVRTC", soname, resolve_nvrtc, why, sizeof why) ? 1 : -1;
        if (state < 0) fprintf(stderr, "microgpt: warning: cudnn-frontend called NVRTC: %s\n", why);
    }
    return state > 0;
}

}  // namespace

extern "C" int cudnn_library_load(char *why, size_t why_len) {
    static int state = 0;  // 0 not tried, 1 loaded, -1 failed
    static char failure[512];
    std::lock_guard<std::mutex> guard(load_lock);
    if (state == 0)
        state = load("cuDNN", MG_SONAME("libcudnn.so.", CUDNN_MAJOR), resolve_cudnn, failure, sizeof failure) ? 1 : -1;
    if (state < 0) snprintf(why, why_len, "%s", failure);
    return state > 0;
}

// A cuDNN function called before cudnn_library_load succeeded is the
// engine's bug (attention_cudnn.cpp loads first): say which, and stop.
#define MG_CUDNN_FORWARDER(ret, name, params, args)                                                      \
    extern "C" ret name params {                                                                         \
        if (!cudnn.name) {                                                                               \
            fprintf(stderr, "microgpt: internal error: %s called before cuDNN was loaded\n", #name);      \
            abort();                                                                                     \
        }                                                                                                \
        return cudnn.name args;                                                                          \
    }
MG_CUDNN_FUNCTIONS(MG_CUDNN_FORWARDER)
#undef MG_CUDNN_FORWARDER

#define MG_NVRTC_FORWARDER(ret, name, params, args)                \
    extern "C" ret name params {                                   \
        if (!nvrtc_load()) return NVRTC_ERROR_INTERNAL_ERROR;      \
        return nvrtc.name args;                                    \
    }
MG_NVRTC_FUNCTIONS(MG_NVRTC_FORWARDER)
#undef MG_NVRTC_FORWARDER
