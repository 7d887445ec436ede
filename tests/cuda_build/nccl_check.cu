// nccl_check.cu: microgpt/cuda/nccl.cuh's host side, without a GPU (tests/cuda_build/test_nccl_header.py).
// One action per run, named by argv[1]:
//   local-rank          prints the local rank the header reads from the environment
//   device COUNT        prints the GPU it picks among COUNT visible ones
//   pin                 pins the NCCL settings (as rank 0), prints them
//   init                creates the one-rank communicator: with no GPU it must fail in one line
#include "../../microgpt/comm.h"
#include "../../microgpt/cuda/nccl.cuh"

#include <stdio.h>

int main(int argc, char **argv) {
    if (argc == 2 && !strcmp(argv[1], "local-rank")) {
        printf("%d\n", nccl_local_rank());
    } else if (argc == 3 && !strcmp(argv[1], "device")) {
        printf("%d\n", nccl_local_device(atoi(argv[2])));
    } else if (argc == 2 && !strcmp(argv[1], "pin")) {
        nccl_pin_determinism(0);
        printf("%s %s %s\n", getenv("NCCL_ALGO"), getenv("NCCL_PROTO"), getenv("NCCL_NVLS_ENABLE"));
    } else if (argc == 2 && !strcmp(argv[1], "init")) {
        Nccl n;
        nccl_init(&n, &mg_comm_single, 0, 1);
        printf("created\n");
    } else {
        fprintf(stderr, "usage: nccl_check local-rank | device COUNT | pin | init\n");
        return 64;
    }
    return 0;
}
