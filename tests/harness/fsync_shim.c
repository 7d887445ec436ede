// fsync_shim.c: a test-only LD_PRELOAD library (built by tests/harness/fsync_shim.py) that makes an
// engine's checkpoint writes as slow as a test needs, or fail late. fsync() first sleeps
// MG_TEST_FSYNC_DELAY_MS milliseconds; with MG_TEST_FSYNC_FAIL=1 it then fails with EIO instead
// of syncing. The engine fsyncs each checkpoint file, then its directory, so a write takes at
// least twice the delay, and a failing one fails after the whole file is written.
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <stdlib.h>
#include <time.h>

int fsync(int fd) {
    static int (*real_fsync)(int);
    if (!real_fsync) real_fsync = (int (*)(int))dlsym(RTLD_NEXT, "fsync");
    const char *delay = getenv("MG_TEST_FSYNC_DELAY_MS");
    long ms = delay ? atol(delay) : 0;
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    while (ms > 0 && nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
    const char *fail = getenv("MG_TEST_FSYNC_FAIL");
    if (fail && fail[0] == '1') {
        errno = EIO;
        return -1;
    }
    return real_fsync(fd);
}
