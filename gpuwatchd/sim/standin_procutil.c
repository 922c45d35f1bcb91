/*
 * Per-process utilization (nvml.h): nvmlDeviceGetProcessUtilization (Maxwell+, the older call) and
 * nvmlDeviceGetProcessesUtilizationInfo (versioned struct, R550+), both served from the state's
 * "process_utilization" samples (gpuwatchd/sim/state.py: 8 numbers per sample, pid timestamp_us sm mem enc dec jpg ofa).
 *
 * Semantics copied from nvml.h:
 *  - only samples whose timeStamp is greater than lastSeenTimeStamp are returned; none -> NVML_ERROR_NOT_FOUND;
 *  - a buffer too small (or NULL) -> NVML_ERROR_INSUFFICIENT_SIZE with the count needed;
 *  - the versioned call checks procesesUtilInfo->version against nvmlProcessesUtilizationInfo_v1 first
 *    (NVML_ERROR_ARGUMENT_VERSION_MISMATCH);
 *  - no samples line in the state (the device does not have the feature) -> NVML_ERROR_NOT_SUPPORTED.
 */
#include "standin.h"

#define EXPORT __attribute__((visibility("default")))
#define PU_WIDTH 8 /* numbers per sample in sdev.putil */

/* With mu held: how many samples are newer than `since`. */
__attribute__((unused)) static unsigned int newer(const sdev *d, unsigned long long since) {
    unsigned int n = 0;
    for (int i = 0; i + PU_WIDTH <= d->putil.n; i += PU_WIDTH)
        if ((unsigned long long)d->putil.v[i + 1] > since) n++;
    return n;
}

__attribute__((unused)) static unsigned int val(long long v) { return v == UNSET ? 0u : (unsigned int)v; }

#ifndef OMIT_nvmlDeviceGetProcessUtilization
EXPORT nvmlReturn_t nvmlDeviceGetProcessUtilization(nvmlDevice_t device, nvmlProcessUtilizationSample_t *utilization,
                                                    unsigned int *processSamplesCount,
                                                    unsigned long long lastSeenTimeStamp) {
    sdev *d;
    nvmlReturn_t r = enter_dev(F_nvmlDeviceGetProcessUtilization, device, processSamplesCount != NULL, &d);
    if (r) return r;
    if (d->putil.n < 0) return leave(NVML_ERROR_NOT_SUPPORTED);
    unsigned int n = newer(d, lastSeenTimeStamp);
    if (n == 0) return leave(NVML_ERROR_NOT_FOUND);
    if (utilization == NULL || *processSamplesCount < n) {
        *processSamplesCount = n;
        return leave(NVML_ERROR_INSUFFICIENT_SIZE);
    }
    unsigned int k = 0;
    for (int i = 0; i + PU_WIDTH <= d->putil.n; i += PU_WIDTH) {
        const long long *s = &d->putil.v[i];
        if ((unsigned long long)s[1] <= lastSeenTimeStamp) continue;
        nvmlProcessUtilizationSample_t *o = &utilization[k++];
        o->pid = val(s[0]);
        o->timeStamp = (unsigned long long)s[1];
        o->smUtil = val(s[2]);
        o->memUtil = val(s[3]);
        o->encUtil = val(s[4]);
        o->decUtil = val(s[5]);
    }
    *processSamplesCount = k;
    return leave(NVML_SUCCESS);
}
#endif

#ifndef OMIT_nvmlDeviceGetProcessesUtilizationInfo
EXPORT nvmlReturn_t nvmlDeviceGetProcessesUtilizationInfo(nvmlDevice_t device,
                                                          nvmlProcessesUtilizationInfo_t *procesesUtilInfo) {
    sdev *d;
    nvmlReturn_t r = enter_dev(F_nvmlDeviceGetProcessesUtilizationInfo, device, procesesUtilInfo != NULL, &d);
    if (r) return r;
    if (procesesUtilInfo->version != nvmlProcessesUtilizationInfo_v1)
        return leave(NVML_ERROR_ARGUMENT_VERSION_MISMATCH);
    if (d->putil.n < 0) return leave(NVML_ERROR_NOT_SUPPORTED);
    unsigned long long since = procesesUtilInfo->lastSeenTimeStamp;
    unsigned int n = newer(d, since);
    if (n == 0) return leave(NVML_ERROR_NOT_FOUND);
    if (procesesUtilInfo->procUtilArray == NULL || procesesUtilInfo->processSamplesCount < n) {
        procesesUtilInfo->processSamplesCount = n;
        return leave(NVML_ERROR_INSUFFICIENT_SIZE);
    }
    unsigned int k = 0;
    for (int i = 0; i + PU_WIDTH <= d->putil.n; i += PU_WIDTH) {
        const long long *s = &d->putil.v[i];
        if ((unsigned long long)s[1] <= since) continue;
        nvmlProcessUtilizationInfo_v1_t *o = &procesesUtilInfo->procUtilArray[k++];
        o->timeStamp = (unsigned long long)s[1];
        o->pid = val(s[0]);
        o->smUtil = val(s[2]);
        o->memUtil = val(s[3]);
        o->encUtil = val(s[4]);
        o->decUtil = val(s[5]);
        o->jpgUtil = val(s[6]);
        o->ofaUtil = val(s[7]);
    }
    procesesUtilInfo->processSamplesCount = k;
    return leave(NVML_SUCCESS);
}
#endif
