// A stand-in for libnvidia-ml.so.1 (test_planted_records.py): the few NVML calls proxy/gpu_identity.py
// makes. The device's name is $FAKE_NVML_NAME (default "Fake GPU"), with " #<index>" or " <uuid>" after it
// for a device other than index 0; the driver is $FAKE_NVML_DRIVER (default "999.01").
#include <stdio.h>
#include <stdlib.h>

typedef struct { char id[64]; } Device;
static Device device;

static const char *env_or(const char *name, const char *fallback) {
    const char *v = getenv(name);
    return v ? v : fallback;
}

int nvmlInit_v2(void) { return 0; }
int nvmlShutdown(void) { return 0; }

int nvmlDeviceGetHandleByIndex_v2(unsigned index, Device **handle) {
    if (index > 3) return 2;  // NVML_ERROR_INVALID_ARGUMENT
    snprintf(device.id, sizeof device.id, index ? " #%u" : "", index);
    *handle = &device;
    return 0;
}

int nvmlDeviceGetHandleByUUID(const char *uuid, Device **handle) {
    snprintf(device.id, sizeof device.id, " %s", uuid);
    *handle = &device;
    return 0;
}

int nvmlDeviceGetName(Device *handle, char *name, unsigned length) {
    snprintf(name, length, "%s%s", env_or("FAKE_NVML_NAME", "Fake GPU"), handle->id);
    return 0;
}

int nvmlSystemGetDriverVersion(char *version, unsigned length) {
    snprintf(version, length, "%s", env_or("FAKE_NVML_DRIVER", "999.01"));
    return 0;
}
