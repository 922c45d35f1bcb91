/*
 * Stand-in MIG devices (nvml.h, "Multi Instance GPU Management"): a GPU in MIG mode hands out MIG device handles,
 * one per compute instance, which the per-device calls accept "with some restrictions" (nvml.h
 * nvmlDeviceIsMigDeviceHandle). The state describes each instance in a `mig_device <index> <gi> <ci>` ...
 * `end_mig_device` block inside its GPU's device block (gpuwatchd/sim/state.py, docs/sim-state.md).
 *
 * A MIG handle is an entry of mig_handles[gpu slot][MIG index], told from a GPU handle by its address. Every
 * per-device call goes through enter_dev, which sends MIG handles here: the call is then served from the
 * instance's own sdev, where only uuid, name, memory and processes (and overrides) are set, so what a real driver
 * answers only for the physical GPU (power, temperature, clocks, PCIe, ECC counters, fans, events...) answers
 * NOT_SUPPORTED on a MIG handle, as the driver does. Delay overrides are not applied on MIG handles.
 */
#include "standin.h"

#define EXPORT __attribute__((visibility("default")))
/* MIG devices one GPU may have: 7 on A100/H100 (one per GPU instance slice); room for compute-instance splits. */
#define MAX_MIG 16

static struct nvmlDevice_st mig_handles[MAX_DEVICES][MAX_MIG];

int is_mig_handle(nvmlDevice_t h) {
    const struct nvmlDevice_st *base = &mig_handles[0][0];
    return h >= base && h < base + (size_t)MAX_DEVICES * MAX_MIG;
}

static smig *find_mig(const sdev *gpu, unsigned int index) {
    if (gpu->mig[0] != NVML_DEVICE_MIG_ENABLE) return NULL;
    for (int i = 0; i < gpu->nmig; i++)
        if (gpu->migs[i].index == index) return &gpu->migs[i];
    return NULL;
}

/* With mu held (enter_dev's path for a MIG handle): the instance behind it, or an error with mu released. */
nvmlReturn_t enter_mig(int fid, nvmlDevice_t h, int args_ok, sdev **out) {
    size_t off = (size_t)(h - &mig_handles[0][0]);
    sdev *gpu = gpu_at((int)(off / MAX_MIG));
    if (!gpu || gpu->lost) return leave(NVML_ERROR_GPU_IS_LOST);
    smig *m = find_mig(gpu, (unsigned int)(off % MAX_MIG));
    /* nvml.h: a destroyed compute instance leaves its MIG handle invalid until it is requested again. */
    if (!m || !args_ok) return leave(NVML_ERROR_INVALID_ARGUMENT);
    int e = m->d.has_overrides ? (m->d.err[fid] ? m->d.err[fid] : m->d.err_all) : 0;
    if (e) return leave((nvmlReturn_t)e);
    *out = &m->d;
    return NVML_SUCCESS;
}

/* ------------------------------------------------------------------------------------------------ state */

void free_migs(sdev *d) {
    for (int i = 0; i < d->nmig; i++) free_dev(&d->migs[i].d);
    free(d->migs);
    d->migs = NULL;
    d->nmig = 0;
}

int parse_mig_line(sdev *gpu, const char *key, char *a) {
    if (!strcmp(key, "mig_device")) {
        long long v[3];
        char tail;
        if (gpu->mig_open || sscanf(a, "%lld %lld %lld%c", &v[0], &v[1], &v[2], &tail) != 3) return -1;
        if (v[0] < 0 || v[0] >= MAX_MIG || v[1] < 0 || v[1] > 0xFFFFFFFELL || v[2] < 0 || v[2] > 0xFFFFFFFELL)
            return -1;
        for (int i = 0; i < gpu->nmig; i++)
            if (gpu->migs[i].index == (unsigned int)v[0]) return -1;
        if (gpu->nmig >= MAX_MIG) return -1;
        smig *grown = realloc(gpu->migs, sizeof(smig) * (size_t)(gpu->nmig + 1));
        if (!grown) return -1;
        gpu->migs = grown;
        smig *m = &gpu->migs[gpu->nmig++];
        dev_defaults(&m->d);
        m->d.evtypes = UNSET; /* nvml.h: no per-instance event reporting through MIG device handles */
        m->index = (unsigned int)v[0];
        m->d.gi = v[1];
        m->d.ci = v[2];
        gpu->mig_open = 1;
        return 1;
    }
    if (!strcmp(key, "end_mig_device")) {
        if (!gpu->mig_open || !gpu->migs[gpu->nmig - 1].d.uuid[0]) return -1;
        gpu->mig_open = 0;
        return 1;
    }
    if (gpu->mig_open) return parse_device_line(&gpu->migs[gpu->nmig - 1].d, key, a) ? -1 : 1;
    if (!strcmp(key, "mig_max")) {
        long long v;
        char tail;
        if (sscanf(a, "%lld%c", &v, &tail) != 1 || v < 0 || v > MAX_MIG) return -1;
        gpu->mig_max = v;
        return 1;
    }
    return 0;
}

/* ------------------------------------------------------------------------------------------------ processes */

int mig_process_count(const sdev *gpu, int kind) {
    int n = 0;
    if (gpu->mig[0] != NVML_DEVICE_MIG_ENABLE) return 0;
    for (int i = 0; i < gpu->nmig; i++) n += gpu->migs[i].d.nproc[kind] > 0 ? gpu->migs[i].d.nproc[kind] : 0;
    return n;
}

void mig_processes(const sdev *gpu, int kind, void *infos, int v1) {
    unsigned int k = 0;
    if (gpu->mig[0] != NVML_DEVICE_MIG_ENABLE) return;
    for (int i = 0; i < gpu->nmig; i++) {
        const sdev *m = &gpu->migs[i].d;
        for (int j = 0; j < m->nproc[kind]; j++) put_process(infos, k++, &m->proc[kind][j], m, v1);
    }
}

/* ------------------------------------------------------------------------------------------------ MIG calls */

#ifndef OMIT_nvmlDeviceGetMaxMigDeviceCount
EXPORT nvmlReturn_t nvmlDeviceGetMaxMigDeviceCount(nvmlDevice_t device, unsigned int *count) {
    sdev *d;
    nvmlReturn_t r = enter_dev(F_nvmlDeviceGetMaxMigDeviceCount, device, count != NULL, &d);
    if (r) return r;
    if (is_mig_handle(device)) return leave(NVML_ERROR_INVALID_ARGUMENT); /* takes the parent GPU's handle */
    /* nvml.h: "Returns zero if MIG is not supported or enabled." */
    *count = d->mig[0] == NVML_DEVICE_MIG_ENABLE && d->mig_max != UNSET ? (unsigned int)d->mig_max : 0;
    return leave(NVML_SUCCESS);
}
#endif

#ifndef OMIT_nvmlDeviceGetMigDeviceHandleByIndex
EXPORT nvmlReturn_t nvmlDeviceGetMigDeviceHandleByIndex(nvmlDevice_t device, unsigned int index,
                                                         nvmlDevice_t *migDevice) {
    sdev *d;
    nvmlReturn_t r = enter_dev(F_nvmlDeviceGetMigDeviceHandleByIndex, device, migDevice != NULL, &d);
    if (r) return r;
    if (is_mig_handle(device)) return leave(NVML_ERROR_INVALID_ARGUMENT);
    if (d->mig[0] == UNSET) return leave(NVML_ERROR_NOT_SUPPORTED); /* not a MIG-capable GPU */
    unsigned int max = d->mig[0] == NVML_DEVICE_MIG_ENABLE && d->mig_max != UNSET ? (unsigned int)d->mig_max : 0;
    if (index >= max) return leave(NVML_ERROR_INVALID_ARGUMENT);
    if (!find_mig(d, index)) return leave(NVML_ERROR_NOT_FOUND); /* an empty slot */
    struct nvmlDevice_st *m = &mig_handles[device->slot][index];
    m->slot = (int)index; /* nvmlDeviceGetIndex on a MIG handle answers its MIG device index (nvml.h) */
    *migDevice = m;
    return leave(NVML_SUCCESS);
}
#endif

#ifndef OMIT_nvmlDeviceIsMigDeviceHandle
EXPORT nvmlReturn_t nvmlDeviceIsMigDeviceHandle(nvmlDevice_t device, unsigned int *isMigDevice) {
    sdev *d;
    nvmlReturn_t r = enter_dev(F_nvmlDeviceIsMigDeviceHandle, device, isMigDevice != NULL, &d);
    if (r) return r;
    *isMigDevice = (unsigned int)is_mig_handle(device);
    return leave(NVML_SUCCESS);
}
#endif

#ifndef OMIT_nvmlDeviceGetDeviceHandleFromMigDeviceHandle
EXPORT nvmlReturn_t nvmlDeviceGetDeviceHandleFromMigDeviceHandle(nvmlDevice_t migDevice, nvmlDevice_t *device) {
    sdev *d;
    nvmlReturn_t r = enter_dev(F_nvmlDeviceGetDeviceHandleFromMigDeviceHandle, migDevice, device != NULL, &d);
    if (r) return r;
    if (!is_mig_handle(migDevice)) return leave(NVML_ERROR_INVALID_ARGUMENT);
    *device = gpu_handle((int)((size_t)(migDevice - &mig_handles[0][0]) / MAX_MIG));
    return leave(NVML_SUCCESS);
}
#endif

/* On a GPU handle these answer NOT_SUPPORTED (its ids are unset): they are questions about a MIG device. */
__attribute__((unused)) static nvmlReturn_t instance_id(int fid, nvmlDevice_t device, unsigned int *id, int compute) {
    sdev *d;
    nvmlReturn_t r = enter_dev(fid, device, id != NULL, &d);
    if (r) return r;
    long long v = compute ? d->ci : d->gi;
    if (v == UNSET) return leave(NVML_ERROR_NOT_SUPPORTED);
    *id = (unsigned int)v;
    return leave(NVML_SUCCESS);
}

#ifndef OMIT_nvmlDeviceGetGpuInstanceId
EXPORT nvmlReturn_t nvmlDeviceGetGpuInstanceId(nvmlDevice_t device, unsigned int *id) {
    return instance_id(F_nvmlDeviceGetGpuInstanceId, device, id, 0);
}
#endif

#ifndef OMIT_nvmlDeviceGetComputeInstanceId
EXPORT nvmlReturn_t nvmlDeviceGetComputeInstanceId(nvmlDevice_t device, unsigned int *id) {
    return instance_id(F_nvmlDeviceGetComputeInstanceId, device, id, 1);
}
#endif
