// signals.h: the signals that drive the engine from outside. Their handlers
// only set flags; the driver acts on them between steps (train.h).
#ifndef MICROGPT_SIGNALS_H
#define MICROGPT_SIGNALS_H

#include <signal.h>
#include <string.h>

static volatile sig_atomic_t mg_stop_requested = 0;   // SIGTERM, SIGINT
static volatile sig_atomic_t mg_ckpt_requested = 0;   // SIGUSR1

static void mg_on_signal(int sig) {
    if (sig == SIGUSR1) mg_ckpt_requested = 1;
    else mg_stop_requested = 1;
}

// The signals whose handlers set the flags above.
static sigset_t mg_flag_signals(void) {
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGUSR1);
    return set;
}

static void mg_install_signals(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = mg_on_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = 0;  // no SA_RESTART: a blocked read returns EINTR
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGUSR1, &sa, NULL);
    // A write past RLIMIT_FSIZE must fail with EFBIG, not kill us mid-save;
    // a vanished proxy must not kill us with SIGPIPE before we checkpoint.
    signal(SIGXFSZ, SIG_IGN);
    signal(SIGPIPE, SIG_IGN);
}

#endif  // MICROGPT_SIGNALS_H
