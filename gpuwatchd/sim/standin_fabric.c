/*
 * The stand-in's GPU fabric calls, as nvml.h declares them:
 *  - nvmlDeviceGetGpuFabricInfoV: an nvmlGpuFabricInfoV_t whose caller set .version to nvmlGpuFabricInfo_v2 (what
 *    pynvml's c_nvmlGpuFabricInfoV_t carries) or nvmlGpuFabricInfo_v3 (adds healthSummary); any other version
 *    answers ARGUMENT_VERSION_MISMATCH, a device without a fabric (no "fabric" line) NOT_SUPPORTED, as a PCIe or
 *    laptop GPU does;
 *  - nvmlDeviceGetP2PStatus: the nvmlGpuP2PStatus_t of one capability (nvmlGpuP2PCapsIndex_t) from device1 to
 *    device2; a device without "p2p" lines answers NOT_SUPPORTED, a peer without its own line the device's
 *    p2p_default line (or NVML_P2P_STATUS_NOT_SUPPORTED).
 * State lines (docs/sim-state.md):
 *   fabric <state> <status> <clique_id> <health_mask> <health_summary>
 *   fabric_cluster <32 hex digits>
 *   p2p <peer index> <read> <write> <nvlink> <atomics> <pci>      (- = NVML_P2P_STATUS_NOT_SUPPORTED)
 *   p2p_default <read> <write> <nvlink> <atomics> <pci>
 */
#include "standin.h"

#define EXPORT __attribute__((visibility("default")))

void fabric_defaults(sdev *d) {
    for (int i = 0; i < 5; i++) d->fabric[i] = UNSET;
    memset(d->fabric_cluster, 0, sizeof(d->fabric_cluster));
    d->p2p_set = 0;
    for (int p = 0; p <= P2P_MAX_PEERS; p++)
        for (int c = 0; c < P2P_CAPS; c++) d->p2p[p][c] = UNSET;
}

int parse_fabric_cluster(sdev *d, const char *a) {
    if (strlen(a) != 2 * NVML_GPU_FABRIC_UUID_LEN) return -1;
    for (int i = 0; i < NVML_GPU_FABRIC_UUID_LEN; i++) {
        unsigned int byte;
        char two[3] = {a[2 * i], a[2 * i + 1], 0};
        char *end;
        errno = 0;
        unsigned long v = strtoul(two, &end, 16);
        if (*end || errno || two[0] == '-' || two[0] == '+' || two[0] == ' ') return -1;
        byte = (unsigned int)v;
        d->fabric_cluster[i] = (unsigned char)byte;
    }
    return 0;
}

/* "p2p <peer> r w nvlink atomics pci" (peer = -1: the p2p_default line). */
int parse_p2p(sdev *d, long long peer, const long long *st) {
    if (peer < -1 || peer >= P2P_MAX_PEERS) return -1;
    for (int c = 0; c < P2P_CAPS; c++)
        if (st[c] != UNSET && (st[c] < 0 || st[c] > NVML_P2P_STATUS_UNKNOWN)) return -1;
    memcpy(d->p2p[peer + 1], st, sizeof(long long) * P2P_CAPS);
    d->p2p_set = 1;
    return 0;
}

#ifndef OMIT_nvmlDeviceGetGpuFabricInfoV
EXPORT nvmlReturn_t nvmlDeviceGetGpuFabricInfoV(nvmlDevice_t device, nvmlGpuFabricInfoV_t *info) {
    sdev *d;
    nvmlReturn_t r = enter_dev(F_nvmlDeviceGetGpuFabricInfoV, device, info != NULL, &d);
    if (r) return r;
    if (info->version != nvmlGpuFabricInfo_v2 && info->version != nvmlGpuFabricInfo_v3)
        return leave(NVML_ERROR_ARGUMENT_VERSION_MISMATCH);
    if (d->fabric[0] == UNSET) return leave(NVML_ERROR_NOT_SUPPORTED);
    memcpy(info->clusterUuid, d->fabric_cluster, NVML_GPU_FABRIC_UUID_LEN);
    info->state = (nvmlGpuFabricState_t)d->fabric[0];
    info->status = (nvmlReturn_t)(d->fabric[1] == UNSET ? NVML_SUCCESS : d->fabric[1]);
    info->cliqueId = (unsigned int)(d->fabric[2] == UNSET ? 0 : d->fabric[2]);
    info->healthMask = (unsigned int)(d->fabric[3] == UNSET ? 0 : d->fabric[3]);
    /* healthSummary is past the end of a v2 struct: only a v3 caller has room for it */
    if (info->version == nvmlGpuFabricInfo_v3)
        info->healthSummary = (unsigned char)(d->fabric[4] == UNSET ? NVML_GPU_FABRIC_HEALTH_SUMMARY_NOT_SUPPORTED
                                                                    : d->fabric[4]);
    return leave(NVML_SUCCESS);
}
#endif

#ifndef OMIT_nvmlDeviceGetP2PStatus
EXPORT nvmlReturn_t nvmlDeviceGetP2PStatus(nvmlDevice_t device1, nvmlDevice_t device2, nvmlGpuP2PCapsIndex_t caps,
                                           nvmlGpuP2PStatus_t *status) {
    sdev *d;
    nvmlReturn_t r = enter_dev(F_nvmlDeviceGetP2PStatus, device1, status != NULL && device2 != NULL &&
                               (int)caps >= 0 && caps < NVML_P2P_CAPS_INDEX_UNKNOWN, &d);
    if (r) return r;
    int peer = peer_slot(device2);
    if (peer < 0) return leave(NVML_ERROR_INVALID_ARGUMENT);
    if (!d->p2p_set) return leave(NVML_ERROR_NOT_SUPPORTED);
    long long v = peer < P2P_MAX_PEERS ? d->p2p[peer + 1][caps] : UNSET;
    if (v == UNSET) v = d->p2p[0][caps];
    *status = (nvmlGpuP2PStatus_t)(v == UNSET ? NVML_P2P_STATUS_NOT_SUPPORTED : v);
    return leave(NVML_SUCCESS);
}
#endif
