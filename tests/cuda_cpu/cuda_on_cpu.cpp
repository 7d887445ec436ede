// cuda_on_cpu.cpp: the runtime of the CPU execution layer (cuda_on_cpu.h):
// fibers and their scheduler, barriers, the warp-collective operations,
// cp.async, device memory, and (CUDA_ON_CPU_HAZARDS) the shadow of shared and
// global memory that finds hazards.
//
// The hazard build never gives this file the -fsanitize=thread
// instrumentation: the hooks below are how instrumented kernel code reports
// its memory accesses, and the runtime's own accesses must not count as the
// kernels'.
#include "cuda_on_cpu.h"
#include "cuda_cpu_check.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

#include <map>
#include <string>
#include <vector>

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#define ASAN 1
#else
#define ASAN 0
#endif

namespace cuda_on_cpu {

// ----------------------------------------------------------------------------
// Fatal errors: a kernel the GPU would hang on or trap in (a barrier some
// threads never reach, a warp-collective operation with lanes missing, a
// cp.async never waited for). One line naming the kernel, exit 3.

static const char *g_kernel = "(no kernel)";  // the kernel running now

[[noreturn]] static void fatal(const char *fmt, ...) {
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    fflush(stdout);
    fprintf(stderr, "cuda_on_cpu: error: %s: %s\n", g_kernel, msg);
    exit(3);
}

[[noreturn]] void trap(const char *what) { fatal("%s", what); }

// ----------------------------------------------------------------------------
// Switching stacks. A fiber's context is its saved stack pointer: switch_stack
// pushes the callee-saved registers (all the x86-64 SysV ABI asks a function
// to keep), stores the stack pointer, loads the other one and pops its
// registers. Thousands of switches per block make glibc's swapcontext (a
// system call each, for the signal mask) the cost to avoid.

#if !defined(__x86_64__)
#error "cuda_on_cpu.cpp switches fiber stacks with x86-64 assembly"
#endif
extern "C" void cuda_on_cpu_switch_stack(void **save_sp, void *load_sp);
asm(R"(
    .text
    .globl cuda_on_cpu_switch_stack
    .type cuda_on_cpu_switch_stack, @function
cuda_on_cpu_switch_stack:
    pushq %rbp
    pushq %rbx
    pushq %r12
    pushq %r13
    pushq %r14
    pushq %r15
    movq %rsp, (%rdi)
    movq %rsi, %rsp
    popq %r15
    popq %r14
    popq %r13
    popq %r12
    popq %rbx
    popq %rbp
    ret
    .size cuda_on_cpu_switch_stack, .-cuda_on_cpu_switch_stack
    .section .note.GNU-stack,"",@progbits
    .text
)");

// A fresh stack whose first switch "returns" into entry, with the stack
// aligned as at a function's entry (rsp = 8 mod 16).
static void *initial_sp(char *stack, size_t bytes, void (*entry)()) {
    uintptr_t top = ((uintptr_t)stack + bytes) & ~(uintptr_t)15;
    void **sp = (void **)(top - 64);
    for (int i = 0; i < 6; i++) sp[i] = nullptr;  // rbp, rbx, r12-r15
    sp[6] = (void *)entry;                         // where the switch returns to
    sp[7] = nullptr;                               // entry's own return address: never used
    return sp;
}

// ----------------------------------------------------------------------------
// Threads as fibers.

enum State { RUNNABLE, AT_BARRIER, AT_WARP, DONE };
enum WarpKind { SHFL_XOR, LDMATRIX, MMA };

struct WarpOp {
    int kind;
    unsigned mask;
    uint64_t bits;   // shuffle: in, then out
    int lane_mask, width;
    const void *addr;  // ldmatrix: this lane's row
    bool trans;
    uint32_t r[4];   // ldmatrix out; mma: a in
    uint32_t b0, b1;
    float c[4];      // mma: in and out
};

// One cp.async copy: issued, committed into a group (-1: not yet), landed at a wait.
struct Copy {
    unsigned char *dst;
    unsigned char data[16];
    int group;
};

struct Fiber {
    void *sp = nullptr;  // saved stack pointer while switched out
    char *stack = nullptr;
    uint3 tid;
    int linear = 0;
    State state = DONE;
    WarpOp op;
    std::vector<Copy> copies;
    int groups_committed = 0;
    int in_runtime = 0;  // > 0: the runtime is working on this thread's behalf (its accesses are not the kernel's)
    void *asan_fake = nullptr;
};

static const size_t STACK_BYTES = 256 << 10;
static const int MAX_THREADS = 1024;
static const size_t MAX_DYNAMIC_SHARED = 227 << 10;  // sm_90's limit per block
static const size_t DEFAULT_DYNAMIC_SHARED = 48 << 10;  // without cudaFuncSetAttribute

static Fiber g_fibers[MAX_THREADS];
static Fiber *g_cur = nullptr;  // the fiber running now, or null outside kernels
static void *g_sched_sp;  // the scheduler's saved stack pointer
#if ASAN
static void *g_sched_fake = nullptr;
static const void *g_main_stack_bottom = nullptr;  // the scheduler's stack, for ASan's fiber switches
static size_t g_main_stack_size = 0;
#endif
static dim3 g_grid, g_block;
static uint3 g_block_idx;
static unsigned g_block_linear;
static int g_nthreads;
static ThreadBody g_body;
static void *g_body_ctx;
static int g_schedule = 0;  // 0: threads and blocks in order; 1: reversed
static cudaError_t g_last_error = cudaSuccess;
static std::map<const void *, int> g_max_dynamic;  // cudaFuncSetAttribute
static unsigned char *g_dynamic;                    // dynamic shared memory, MAX_DYNAMIC_SHARED bytes
static std::vector<std::string> g_launched;         // kernel names, in launch order

uint3 thread_idx() { return g_cur->tid; }
uint3 block_idx() { return g_block_idx; }
dim3 block_dim() { return g_block; }
dim3 grid_dim() { return g_grid; }
unsigned char *dynamic_shared() { return g_dynamic; }

static void switch_to_scheduler(bool finished) {
    Fiber *f = g_cur;
#if ASAN
    __sanitizer_start_switch_fiber(finished ? nullptr : &f->asan_fake, g_main_stack_bottom, g_main_stack_size);
#endif
    cuda_on_cpu_switch_stack(&f->sp, g_sched_sp);
#if ASAN
    __sanitizer_finish_switch_fiber(f->asan_fake, nullptr, nullptr);
#endif
    (void)finished;
}

static void fiber_entry() {
#if ASAN
    __sanitizer_finish_switch_fiber(nullptr, &g_main_stack_bottom, &g_main_stack_size);
#endif
    g_body(g_body_ctx);
    Fiber *f = g_cur;
    if (!f->copies.empty())
        fatal("thread (%u,%u,%u) of block (%u,%u,%u) exited with %zu cp.async copies never waited for", f->tid.x, f->tid.y,
              f->tid.z, g_block_idx.x, g_block_idx.y, g_block_idx.z, f->copies.size());
    f->state = DONE;
    switch_to_scheduler(true);
    fatal("internal: a finished fiber was resumed");
}

static void run_fiber(Fiber *f) {
    g_cur = f;
#if ASAN
    __sanitizer_start_switch_fiber(&g_sched_fake, f->stack, STACK_BYTES);
#endif
    cuda_on_cpu_switch_stack(&g_sched_sp, f->sp);
#if ASAN
    __sanitizer_finish_switch_fiber(g_sched_fake, &g_main_stack_bottom, &g_main_stack_size);
#endif
    g_cur = nullptr;
}

// Marks the runtime's work on the running thread's behalf: code it calls may
// be instrumented too (an inline function of the standard library can come
// from a kernel unit), and those accesses are not the kernel's.
struct InRuntime {
    Fiber *f;
    explicit InRuntime(Fiber *fiber = g_cur) : f(fiber) {
        if (f) f->in_runtime++;
    }
    ~InRuntime() {
        if (f) f->in_runtime--;
    }
};

// Parks the running fiber until the scheduler releases it.
static void wait_as(State s) {
    g_cur->state = s;
    switch_to_scheduler(false);
}

// ----------------------------------------------------------------------------
// The hazard shadow (CUDA_ON_CPU_HAZARDS). Serials number barrier epochs:
// every block start and every __syncthreads release begins a new one, so two
// accesses are in one epoch exactly when their serials are equal.

static uint32_t g_serial = 1, g_block_serial = 1, g_launch_serial = 1;

extern "C" char __bss_start[], _end[];  // the executable's .bss: where `static` (__shared__) storage lives

#ifdef CUDA_ON_CPU_HAZARDS
// One byte's last write, and its readers in the latest epoch that read it:
// the first, and one other thread (NOBODY if none).
struct Cell {
    uint32_t w_serial, w_thread, r_serial, r_thread, r_other;
    const void *w_pc, *r_pc, *r_other_pc;
};
static const uint32_t NOBODY = 0xffffffffu;

struct Region {
    uintptr_t lo, hi;
    bool shared;
    std::vector<Cell> cells;
    std::string name;
};
static Region g_bss, g_dyn;
static std::vector<Region *> g_globals;  // device allocations, by address

struct Hazard {
    std::string kind, space, kernel;  // space: "shared memory", "global memory `name`", ...
    const void *pc_a, *pc_b;
    uint32_t thread_a, thread_b;
    uint3 block;
    long count;
};
static std::vector<Hazard> g_hazards;
static long g_hazard_total = 0;

// A hazard of thread a (at pc_a) with thread b (at pc_b; none for an
// out-of-bounds access or a read of unwritten memory). Counted always, kept
// once per (kind, kernel, places).
static void report(const char *kind, const Region &r, const void *pc_a, uint32_t thread_a, const void *pc_b,
                   uint32_t thread_b) {
    g_hazard_total++;
    for (Hazard &h : g_hazards)
        if (h.kind == kind && h.pc_a == pc_a && h.pc_b == pc_b && h.kernel == g_kernel) {
            h.count++;
            return;
        }
    if (g_hazards.size() < 64)
        g_hazards.push_back({kind, r.shared ? "shared memory" : "global memory " + r.name, g_kernel, pc_a, pc_b,
                             thread_a, thread_b, g_block_idx, 1});
}

static Region *find_region(uintptr_t a) {
    if (a >= g_dyn.lo && a < g_dyn.hi) return &g_dyn;
    if (a >= g_bss.lo && a < g_bss.hi) return &g_bss;
    size_t lo = 0, hi = g_globals.size();
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (g_globals[mid]->hi <= a) lo = mid + 1;
        else hi = mid;
    }
    if (lo < g_globals.size() && a >= g_globals[lo]->lo) return g_globals[lo];
    return nullptr;
}

static Region g_gap = {0, 0, false, {}, "past an allocation"};

// One access of n bytes at a by thread f (from the kernel's code at pc, or,
// by_runtime, from the runtime acting for it: cp.async, ldmatrix).
static void shadow_access(Fiber *f, uintptr_t a, size_t n, bool write, const void *pc, bool by_runtime = false) {
    if (!f || (f->in_runtime && !by_runtime)) return;
    uintptr_t sp = (uintptr_t)f->stack;
    if (a >= sp && a < sp + STACK_BYTES) return;  // the thread's own stack: private
    InRuntime busy(f);
    uint32_t me = g_block_linear * MAX_THREADS + (uint32_t)f->linear;
    Region *r = find_region(a);
    if (!r) {
        if (device_arena_contains((const void *)a))
            report(write ? "out-of-bounds write" : "out-of-bounds read", g_gap, pc, me, nullptr, 0);
        return;  // constants, the runtime's own memory: not device memory
    }
    uint32_t first = r->shared ? g_block_serial : g_launch_serial;
    for (size_t i = 0; i < n; i++) {
        if (a + i >= r->hi) {
            r = find_region(a + i);
            if (!r) return;
        }
        Cell &c = r->cells[a + i - r->lo];
        bool w_here = c.w_serial >= first && c.w_serial != 0;
        // Another thread's access conflicts in the same epoch; in global
        // memory, any access by another block of the launch conflicts too.
        bool w_conflict = w_here && c.w_thread != me &&
                          (c.w_serial == g_serial || (!r->shared && c.w_thread / MAX_THREADS != me / MAX_THREADS));
        if (write) {
            if (w_conflict) report("write-after-write", *r, pc, me, c.w_pc, c.w_thread);
            bool r_here = c.r_serial >= first && c.r_serial != 0;
            uint32_t reader = c.r_thread != me ? c.r_thread : c.r_other;
            const void *reader_pc = c.r_thread != me ? c.r_pc : c.r_other_pc;
            if (r_here && reader != NOBODY &&
                (c.r_serial == g_serial || (!r->shared && reader / MAX_THREADS != me / MAX_THREADS)))
                report("write-after-read", *r, pc, me, reader_pc, reader);
            c.w_serial = g_serial;
            c.w_thread = me;
            c.w_pc = pc;
        } else {
            if (w_conflict) report("read-after-write", *r, pc, me, c.w_pc, c.w_thread);
            else if (r->shared && !w_here) report("read of a byte not written in this block", *r, pc, me, nullptr, 0);
            if (c.r_serial != g_serial) {
                c.r_serial = g_serial;
                c.r_thread = me;
                c.r_pc = pc;
                c.r_other = NOBODY;
            } else if (c.r_thread != me) {
                c.r_other = me;
                c.r_other_pc = pc;
            }
        }
    }
}

static void region_init(Region &r, uintptr_t lo, uintptr_t hi, bool shared, const char *name) {
    r.lo = lo;
    r.hi = hi;
    r.shared = shared;
    r.name = name;
    r.cells.assign(hi - lo, Cell{0, 0, 0, 0, NOBODY, nullptr, nullptr, nullptr});
}

static void hazards_init() {
    if (g_bss.hi) return;
    region_init(g_bss, (uintptr_t)__bss_start, (uintptr_t)_end, true, "static");
    region_init(g_dyn, (uintptr_t)g_dynamic, (uintptr_t)g_dynamic + MAX_DYNAMIC_SHARED, true, "dynamic");
}

void shadow_register(const void *p, size_t bytes, const char *name) {
    Region *r = new Region;
    region_init(*r, (uintptr_t)p, (uintptr_t)p + bytes, false, name);
    auto at = std::lower_bound(g_globals.begin(), g_globals.end(), r,
                               [](const Region *x, const Region *y) { return x->lo < y->lo; });
    g_globals.insert(at, r);
}

void shadow_unregister(const void *p) {
    for (size_t i = 0; i < g_globals.size(); i++)
        if (g_globals[i]->lo == (uintptr_t)p) {
            delete g_globals[i];
            g_globals.erase(g_globals.begin() + i);
            return;
        }
}

#define SHADOW(addr, n, write) \
    cuda_on_cpu::shadow_access(cuda_on_cpu::g_cur, (uintptr_t)(addr), (n), (write), __builtin_return_address(0))
#else
static void hazards_init() {}
void shadow_register(const void *, size_t, const char *) {}
void shadow_unregister(const void *) {}
#define SHADOW(addr, n, write) ((void)0)
#endif

// The runtime's own accesses on a thread's behalf (cp.async, ldmatrix) are
// recorded explicitly, attributed to the call site in the kernel.
static void record(Fiber *f, const void *addr, size_t n, bool write, const void *pc) {
#ifdef CUDA_ON_CPU_HAZARDS
    shadow_access(f, (uintptr_t)addr, n, write, pc, true);
#else
    (void)f, (void)addr, (void)n, (void)write, (void)pc;
#endif
}

// ----------------------------------------------------------------------------
// Barriers and warp-collective operations.

void syncthreads() {
    InRuntime busy;
    wait_as(AT_BARRIER);
}

static void warp_op(WarpOp &op) {
    InRuntime busy;
    g_cur->op = op;
    wait_as(AT_WARP);
    op = g_cur->op;
}

uint64_t shfl_xor(unsigned mask, uint64_t bits, int lane_mask, int width) {
    WarpOp op = {};
    op.kind = SHFL_XOR;
    op.mask = mask;
    op.bits = bits;
    op.lane_mask = lane_mask;
    op.width = width;
    warp_op(op);
    return op.bits;
}

// Shared memory: the dynamic buffer, or `static` (__shared__) storage.
static bool is_shared(const void *p) {
    const char *c = (const char *)p;
    return ((const unsigned char *)p >= g_dynamic && (const unsigned char *)p < g_dynamic + MAX_DYNAMIC_SHARED) ||
           (c >= __bss_start && c < _end);
}

static const void *g_ldmatrix_pc[MAX_THREADS];

void ldmatrix_x4(uint32_t r[4], const void *row, bool trans) {
    InRuntime busy;
    if ((uintptr_t)row % 16) fatal("ldmatrix: a row address not 16-byte aligned (thread %d)", g_cur->linear);
    if (!is_shared(row)) fatal("ldmatrix: a row address outside shared memory (thread %d)", g_cur->linear);
    g_ldmatrix_pc[g_cur->linear] = __builtin_return_address(0);
    WarpOp op = {};
    op.kind = LDMATRIX;
    op.mask = 0xffffffffu;
    op.addr = row;
    op.trans = trans;
    warp_op(op);
    memcpy(r, op.r, sizeof op.r);
}

void mma_bf16_16816(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1) {
    InRuntime busy;
    WarpOp op = {};
    op.kind = MMA;
    op.mask = 0xffffffffu;
    memcpy(op.r, a, sizeof op.r);
    op.b0 = b0;
    op.b1 = b1;
    memcpy(op.c, c, sizeof op.c);
    warp_op(op);
    memcpy(c, op.c, sizeof op.c);
}

static float bf16_lo(uint32_t r) { return __bfloat162float(__nv_bfloat16{(unsigned short)(r & 0xffff)}); }
static float bf16_hi(uint32_t r) { return __bfloat162float(__nv_bfloat16{(unsigned short)(r >> 16)}); }

// The 32 lanes of warp w are at one collective operation: check they agree
// on it, then carry it out. The fragment layouts are the PTX ISA's (see
// microgpt/cuda/attention_flash.cuh), with g = lane / 4 and t = lane % 4.
static void resolve_warp(Fiber *lane) {
    const WarpOp &op0 = lane[0].op;
    for (int l = 0; l < 32; l++) {
        if (lane[l].op.kind != op0.kind)
            fatal("warp %d: lanes at different warp-collective operations (lane 0 kind %d, lane %d kind %d)",
                  lane[0].linear / 32, op0.kind, l, lane[l].op.kind);
        if (lane[l].op.mask != 0xffffffffu)
            fatal("warp %d: a warp-collective operation with mask %#x; only full warps are modelled", lane[0].linear / 32,
                  lane[l].op.mask);
    }
    if (op0.kind == SHFL_XOR) {
        uint64_t in[32];
        for (int l = 0; l < 32; l++) in[l] = lane[l].op.bits;
        for (int l = 0; l < 32; l++) {
            int w = lane[l].op.width, src = l ^ lane[l].op.lane_mask;
            // A source outside the lane's segment of `width` lanes gives the lane its own value.
            if (w <= 0 || w > 32 || (w & (w - 1))) fatal("__shfl_xor_sync: width %d is not a power of two <= 32", w);
            if (src / w != l / w) src = l;
            lane[l].op.bits = in[src];
        }
    } else if (op0.kind == LDMATRIX) {
        for (int l = 0; l < 32; l++)
            if (lane[l].op.trans != op0.trans) fatal("ldmatrix: lanes disagree on .trans");
        // Matrix m's rows come from lanes 8m..8m+7, 16 bytes (8 bf16) each.
        for (int l = 0; l < 32; l++) record(&lane[l], lane[l].op.addr, 16, false, g_ldmatrix_pc[lane[l].linear]);
        for (int l = 0; l < 32; l++) {
            int g = l / 4, t = l % 4;
            for (int m = 0; m < 4; m++) {
                unsigned short lo, hi;
                if (!op0.trans) {  // (row g, cols 2t, 2t+1)
                    const unsigned short *row = (const unsigned short *)lane[8 * m + g].op.addr;
                    lo = row[2 * t];
                    hi = row[2 * t + 1];
                } else {  // (rows 2t, 2t+1, col g)
                    lo = ((const unsigned short *)lane[8 * m + 2 * t].op.addr)[g];
                    hi = ((const unsigned short *)lane[8 * m + 2 * t + 1].op.addr)[g];
                }
                lane[l].op.r[m] = (uint32_t)lo | ((uint32_t)hi << 16);
            }
        }
    } else {  // MMA: D = A B + C, A 16x16, B 16x8, C and D 16x8
        double A[16][16], B[16][8], Cm[16][8];
        for (int l = 0; l < 32; l++) {
            int g = l / 4, t = l % 4;
            const WarpOp &o = lane[l].op;
            A[g][2 * t] = bf16_lo(o.r[0]);          A[g][2 * t + 1] = bf16_hi(o.r[0]);
            A[g + 8][2 * t] = bf16_lo(o.r[1]);      A[g + 8][2 * t + 1] = bf16_hi(o.r[1]);
            A[g][2 * t + 8] = bf16_lo(o.r[2]);      A[g][2 * t + 9] = bf16_hi(o.r[2]);
            A[g + 8][2 * t + 8] = bf16_lo(o.r[3]);  A[g + 8][2 * t + 9] = bf16_hi(o.r[3]);
            B[2 * t][g] = bf16_lo(o.b0);            B[2 * t + 1][g] = bf16_hi(o.b0);
            B[2 * t + 8][g] = bf16_lo(o.b1);        B[2 * t + 9][g] = bf16_hi(o.b1);
            Cm[g][2 * t] = o.c[0];     Cm[g][2 * t + 1] = o.c[1];
            Cm[g + 8][2 * t] = o.c[2]; Cm[g + 8][2 * t + 1] = o.c[3];
        }
        for (int l = 0; l < 32; l++) {
            int g = l / 4, t = l % 4;
            for (int e = 0; e < 4; e++) {
                int i = g + (e >= 2 ? 8 : 0), j = 2 * t + (e & 1);
                double acc = 0;
                for (int k = 0; k < 16; k++) acc += A[i][k] * B[k][j];
                lane[l].op.c[e] = (float)(acc + Cm[i][j]);
            }
        }
    }
    for (int l = 0; l < 32; l++) lane[l].state = RUNNABLE;
}

// ----------------------------------------------------------------------------
// cp.async: a copy lands at the wait that covers its group; until then its
// destination holds NaN bytes.

void cp_async16(void *dst, const void *src, bool valid) {
    const void *pc = __builtin_return_address(0);
    InRuntime busy;
    if ((uintptr_t)dst % 16 || (valid && (uintptr_t)src % 16))
        fatal("cp.async: an address not 16-byte aligned (thread %d)", g_cur->linear);
    if (!is_shared(dst)) fatal("cp.async: a destination outside shared memory (thread %d)", g_cur->linear);
    Copy c;
    c.dst = (unsigned char *)dst;
    c.group = -1;
    if (valid) {
        record(g_cur, src, 16, false, pc);
        memcpy(c.data, src, 16);
    } else {
        memset(c.data, 0, 16);
    }
    record(g_cur, dst, 16, true, pc);
    memset(dst, 0xff, 16);
    g_cur->copies.push_back(c);
}

void cp_async_commit() {
    InRuntime busy;
    Fiber *f = g_cur;
    for (Copy &c : f->copies)
        if (c.group < 0) c.group = f->groups_committed;
    f->groups_committed++;
}

void cp_async_wait(int n) {
    const void *pc = __builtin_return_address(0);
    InRuntime busy;
    Fiber *f = g_cur;
    std::vector<Copy> keep;
    for (Copy &c : f->copies) {
        if (c.group >= 0 && c.group < f->groups_committed - n) {
            record(f, c.dst, 16, true, pc);
            memcpy(c.dst, c.data, 16);
        } else {
            keep.push_back(c);
        }
    }
    f->copies.swap(keep);
}

// ----------------------------------------------------------------------------
// Launching.

cudaError_t func_set_attribute(const void *kernel, cudaFuncAttribute attr, int value) {
    if (attr != cudaFuncAttributeMaxDynamicSharedMemorySize || value < 0 || (size_t)value > MAX_DYNAMIC_SHARED)
        return g_last_error = cudaErrorInvalidValue;
    g_max_dynamic[kernel] = value;
    return cudaSuccess;
}

cudaError_t last_error() {
    cudaError_t e = g_last_error;
    g_last_error = cudaSuccess;
    return e;
}

const char *error_string(cudaError_t err) {
    switch (err) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorInvalidConfiguration: return "invalid configuration argument";
    }
    return "unknown error";
}

static void run_block() {
    int n = g_nthreads;
    for (int i = 0; i < n; i++) {
        Fiber &f = g_fibers[i];
        if (!f.stack) {
            f.stack = (char *)mmap(nullptr, STACK_BYTES, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
            if (f.stack == MAP_FAILED) fatal("out of memory for thread stacks");
        }
        f.linear = i;
        f.tid = uint3{(unsigned)i % g_block.x, (unsigned)i / g_block.x % g_block.y, (unsigned)i / (g_block.x * g_block.y)};
        f.state = RUNNABLE;
        f.copies.clear();
        f.groups_committed = 0;
        f.in_runtime = 0;
        f.sp = initial_sp(f.stack, STACK_BYTES, fiber_entry);
    }
    g_serial++;
    g_block_serial = g_serial;
    for (;;) {
        for (int k = 0; k < n; k++) {
            Fiber *f = &g_fibers[g_schedule ? n - 1 - k : k];
            if (f->state == RUNNABLE) run_fiber(f);
        }
        // Every thread is now waiting or done. Warps whose lanes all wait at a
        // collective operation go on first; then a barrier every live thread
        // has reached opens.
        bool progressed = false;
        int live = 0, at_barrier = 0;
        for (int w = 0; w * 32 < n; w++) {
            Fiber *lane = &g_fibers[w * 32];
            int lanes = n - w * 32 < 32 ? n - w * 32 : 32, waiting = 0, done = 0;
            for (int l = 0; l < lanes; l++) {
                waiting += lane[l].state == AT_WARP;
                done += lane[l].state == DONE;
            }
            if (!waiting) continue;
            if (lanes < 32)
                fatal("warp %d has %d threads: a warp-collective operation needs all 32 lanes (blockDim %u)", w, lanes,
                      g_block.x * g_block.y * g_block.z);
            if (waiting == 32) {
                resolve_warp(lane);
                progressed = true;
            } else if (waiting + done == 32) {
                fatal("warp %d: %d lanes wait at a warp-collective operation whose mask names %d lanes that exited", w,
                      waiting, done);
            }
        }
        if (progressed) continue;
        for (int i = 0; i < n; i++) {
            live += g_fibers[i].state != DONE;
            at_barrier += g_fibers[i].state == AT_BARRIER;
        }
        if (!live) break;
        if (at_barrier == live) {
            g_serial++;
            for (int i = 0; i < n; i++)
                if (g_fibers[i].state == AT_BARRIER) g_fibers[i].state = RUNNABLE;
            continue;
        }
        int at_warp = live - at_barrier;
        fatal("block (%u,%u,%u): %d threads wait at __syncthreads while %d wait at a warp-collective operation",
              g_block_idx.x, g_block_idx.y, g_block_idx.z, at_barrier, at_warp);
    }
}

cudaError_t launch(const char *name, const void *kernel, dim3 grid, dim3 block, size_t shared_bytes, ThreadBody body,
                   void *ctx) {
    if (!g_dynamic) {
        g_dynamic = (unsigned char *)aligned_alloc(128, MAX_DYNAMIC_SHARED);
        if (!g_dynamic) fatal("out of memory for shared memory");
    }
    hazards_init();
    size_t threads = (size_t)block.x * block.y * block.z;
    auto limit = g_max_dynamic.find(kernel);
    size_t dyn_limit = limit == g_max_dynamic.end() ? DEFAULT_DYNAMIC_SHARED : (size_t)limit->second;
    if (!threads || threads > MAX_THREADS || block.z > 64 || !grid.x || !grid.y || !grid.z || grid.y > 65535 ||
        grid.z > 65535)
        return g_last_error = cudaErrorInvalidConfiguration;
    if (shared_bytes > dyn_limit) return g_last_error = cudaErrorInvalidValue;
    g_kernel = name;
    g_launched.push_back(name);
    g_grid = grid;
    g_block = block;
    g_nthreads = (int)threads;
    g_body = body;
    g_body_ctx = ctx;
    memset(g_dynamic, 0xff, MAX_DYNAMIC_SHARED);  // never-written shared memory reads as NaN
    g_serial++;
    g_launch_serial = g_serial;
    size_t blocks = (size_t)grid.x * grid.y * grid.z;
    for (size_t k = 0; k < blocks; k++) {
        size_t b = g_schedule ? blocks - 1 - k : k;
        g_block_linear = (unsigned)b;
        g_block_idx = uint3{(unsigned)(b % grid.x), (unsigned)(b / grid.x % grid.y), (unsigned)(b / ((size_t)grid.x * grid.y))};
        run_block();
    }
    g_kernel = "(no kernel)";
    return cudaSuccess;
}

// ----------------------------------------------------------------------------
// Device memory: one arena, a gap of at least GAP poisoned bytes after each
// allocation (ASan's poison in the asan build; the shadow knows the gaps in
// the hazard build).

static const size_t ARENA_BYTES = (size_t)1 << 32, GAP = 4096;
static unsigned char *g_arena;
static size_t g_arena_used;

void *device_alloc(size_t bytes, const char *name) {
    if (!g_arena) {
        g_arena = (unsigned char *)mmap(nullptr, ARENA_BYTES, PROT_READ | PROT_WRITE,
                                        MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (g_arena == MAP_FAILED) fatal("cannot map the device arena");
#if ASAN
        ASAN_POISON_MEMORY_REGION(g_arena, ARENA_BYTES);
#endif
    }
    size_t at = (g_arena_used + 255) & ~(size_t)255;
    if (at + bytes + GAP > ARENA_BYTES) fatal("the device arena is full");
    unsigned char *p = g_arena + at;
#if ASAN
    ASAN_UNPOISON_MEMORY_REGION(p, bytes);
#endif
    memset(p, 0xff, bytes);
    g_arena_used = at + bytes + GAP;
    shadow_register(p, bytes, name);
    return p;
}

void device_free_all() {
#ifdef CUDA_ON_CPU_HAZARDS
    for (Region *r : g_globals) delete r;
    g_globals.clear();
#endif
#if ASAN
    if (g_arena) ASAN_POISON_MEMORY_REGION(g_arena, g_arena_used);
#endif
    g_arena_used = 0;
}

bool device_arena_contains(const void *p) {
    return g_arena && (const unsigned char *)p >= g_arena && (const unsigned char *)p < g_arena + g_arena_used;
}

// ----------------------------------------------------------------------------
// What the checks (cuda_cpu_check.h) ask of the runtime.

void set_schedule(int schedule) { g_schedule = schedule; }

std::vector<std::string> take_launched() {
    std::vector<std::string> out;
    out.swap(g_launched);
    return out;
}

#ifdef CUDA_ON_CPU_HAZARDS
// Where a code address is: its source line, then the lines it was inlined
// into, innermost first ("microgpt/cuda/ptx.cuh:76 < microgpt/cuda/
// attention_flash.cuh:116 < ..."), from addr2line on this executable (linked
// without PIE, so addresses are its own).
static std::string where(const void *pc) {
    if (!pc) return "?";
    char cmd[512];
    snprintf(cmd, sizeof cmd, "addr2line -i -e /proc/%d/exe %p 2>/dev/null", (int)getpid(),
             (const void *)((uintptr_t)pc - 1));
    FILE *p = popen(cmd, "r");
    if (!p) return "?";
    std::string chain;
    char line[1024];
    for (int n = 0; n < 4 && fgets(line, sizeof line, p);) {
        std::string s(line);
        while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
        size_t paren = s.find(" (");
        if (paren != std::string::npos) s = s.substr(0, paren);
        size_t at = s.rfind("microgpt/");
        if (at == std::string::npos) at = s.rfind("tests/cuda_cpu/");
        if (at == std::string::npos) continue;
        chain += (chain.empty() ? "" : " < ") + s.substr(at);
        n++;
    }
    pclose(p);
    return chain.empty() ? "?" : chain;
}
#endif

long hazard_count() {
#ifdef CUDA_ON_CPU_HAZARDS
    return g_hazard_total;
#else
    return -1;
#endif
}

std::vector<std::string> take_hazard_reports() {
    std::vector<std::string> out;
#ifdef CUDA_ON_CPU_HAZARDS
    for (const Hazard &h : g_hazards) {
        char buf[1536];
        uint32_t ta = h.thread_a % MAX_THREADS;
        char tb[64];  // the other thread, with its block when that is another one (global memory)
        if (h.thread_b / MAX_THREADS == h.thread_a / MAX_THREADS) snprintf(tb, sizeof tb, "%u", h.thread_b % MAX_THREADS);
        else snprintf(tb, sizeof tb, "%u of block #%u", h.thread_b % MAX_THREADS, h.thread_b / MAX_THREADS);
        if (h.pc_b)
            snprintf(buf, sizeof buf, "%s in %s, %s, block (%u,%u,%u): thread %u at %s, after thread %s at %s (%ld times)",
                     h.kind.c_str(), h.space.c_str(), h.kernel.c_str(), h.block.x, h.block.y, h.block.z, ta,
                     where(h.pc_a).c_str(), tb, where(h.pc_b).c_str(), h.count);
        else
            snprintf(buf, sizeof buf, "%s in %s, %s, block (%u,%u,%u): thread %u at %s (%ld times)", h.kind.c_str(),
                     h.space.c_str(), h.kernel.c_str(), h.block.x, h.block.y, h.block.z, ta, where(h.pc_a).c_str(),
                     h.count);
        out.push_back(buf);
    }
    g_hazards.clear();
    g_hazard_total = 0;
#endif
    return out;
}

}  // namespace cuda_on_cpu

// ----------------------------------------------------------------------------
// The instrumentation's entry points. GCC's -fsanitize=thread turns every
// load and store of kernel code into a call of one of these; with the hazard
// shadow they feed it, and the ThreadSanitizer runtime is not linked.
#ifdef CUDA_ON_CPU_HAZARDS
#define HOOK_RW(n)                                                                                        \
    extern "C" void __tsan_read##n(void *a) { SHADOW(a, n, false); }                                     \
    extern "C" void __tsan_write##n(void *a) { SHADOW(a, n, true); }                                     \
    extern "C" void __tsan_unaligned_read##n(void *a) { SHADOW(a, n, false); }                           \
    extern "C" void __tsan_unaligned_write##n(void *a) { SHADOW(a, n, true); }                           \
    extern "C" void __tsan_volatile_read##n(void *a) { SHADOW(a, n, false); }                            \
    extern "C" void __tsan_volatile_write##n(void *a) { SHADOW(a, n, true); }
HOOK_RW(1)
HOOK_RW(2)
HOOK_RW(4)
HOOK_RW(8)
HOOK_RW(16)
extern "C" void __tsan_read_range(void *a, unsigned long n) { SHADOW(a, n, false); }
extern "C" void __tsan_write_range(void *a, unsigned long n) { SHADOW(a, n, true); }
extern "C" void __tsan_init() {}
extern "C" void __tsan_func_entry(void *) {}
extern "C" void __tsan_func_exit() {}
extern "C" void __tsan_vptr_update(void **, void *) {}
extern "C" void __tsan_vptr_read(void **) {}
#endif
