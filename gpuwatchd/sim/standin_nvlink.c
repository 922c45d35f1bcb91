/*
 * The stand-in's NVLink field values and the GPU recovery action (nvmlDeviceGetFieldValues), as nvml.h declares them:
 *  - NVML_FI_DEV_NVLINK_{CRC_FLIT,CRC_DATA,REPLAY,RECOVERY}_ERROR_COUNT_L<n>: one id per link, links 0-5 and 6-11;
 *  - NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_{TX,RX}: the link in scopeId, UINT_MAX for the sum over all links (KiB);
 *  - NVML_FI_DEV_GET_GPU_RECOVERY_ACTION: an nvmlDeviceGpuRecoveryAction_t, device-wide.
 * A link past the device's last one (its "nvlink" state list) answers INVALID_ARGUMENT in that value's nvmlReturn; a
 * device without NVLink, or a value unset in the state ("-"), answers NOT_SUPPORTED. State lines (docs/sim-state.md):
 *   nvlink_counters <link> <tx_kib> <rx_kib> <crc_flit> <crc_data> <replay> <recovery>
 *   recovery_action <n>
 */
#include "standin.h"

enum { NVC_TX, NVC_RX, NVC_CRC_FLIT, NVC_CRC_DATA, NVC_REPLAY, NVC_RECOVERY };

void nvlink_defaults(sdev *d) {
    d->recovery_action = UNSET;
    for (int l = 0; l < NVML_NVLINK_MAX_LINKS; l++)
        for (int k = 0; k < NVLINK_COUNTERS; k++) d->nvc[l][k] = UNSET;
}

int parse_nvlink_counters(sdev *d, char *a) {
    char *sp = strchr(a, ' ');
    if (!sp) return -1;
    *sp = 0;
    char *end;
    errno = 0;
    long long link = strtoll(a, &end, 10);
    if (end == a || *end || errno || link < 0 || link >= NVML_NVLINK_MAX_LINKS) return -1;
    long long tmp[16];
    /* the counters go through the same number parser as every other line ("-" = unset) */
    if (standin_parse_nums(sp + 1, tmp, 16) != NVLINK_COUNTERS) return -1;
    for (int k = 0; k < NVLINK_COUNTERS; k++) {
        if (tmp[k] != UNSET && tmp[k] < 0) return -1;
        d->nvc[link][k] = tmp[k];
    }
    return 0;
}

/* _L<n> id -> (counter, link); -1 when the id is not a per-link error counter. */
static int error_id(unsigned int id, int *link) {
    static const struct {
        unsigned int l0, l6;
        int counter;
    } ids[] = {
        {NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_L0, NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_L6, NVC_CRC_FLIT},
        {NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_L0, NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_L6, NVC_CRC_DATA},
        {NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_L0, NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_L6, NVC_REPLAY},
        {NVML_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_L0, NVML_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_L6, NVC_RECOVERY},
    };
    for (size_t i = 0; i < sizeof(ids) / sizeof(ids[0]); i++) {
        if (id >= ids[i].l0 && id < ids[i].l0 + 6) {
            *link = (int)(id - ids[i].l0);
            return ids[i].counter;
        }
        if (id >= ids[i].l6 && id < ids[i].l6 + 6) {
            *link = 6 + (int)(id - ids[i].l6);
            return ids[i].counter;
        }
    }
    return -1;
}

static void put_ull(nvmlFieldValue_t *v, long long x) {
    if (x == UNSET) return; /* stays NOT_SUPPORTED */
    v->valueType = NVML_VALUE_TYPE_UNSIGNED_LONG_LONG;
    v->value.ullVal = (unsigned long long)x;
    v->nvmlReturn = NVML_SUCCESS;
}

int nvlink_field_value(const sdev *d, nvmlFieldValue_t *v) {
    if (v->fieldId == NVML_FI_DEV_GET_GPU_RECOVERY_ACTION) {
        if (d->recovery_action != UNSET) {
            v->valueType = NVML_VALUE_TYPE_UNSIGNED_INT;
            v->value.uiVal = (unsigned int)d->recovery_action;
            v->nvmlReturn = NVML_SUCCESS;
        }
        return 1;
    }
    int link = -1, counter = error_id(v->fieldId, &link);
    if (counter < 0) {
        if (v->fieldId == NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX) counter = NVC_TX;
        else if (v->fieldId == NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX) counter = NVC_RX;
        else return 0;
        link = v->scopeId == UINT_MAX ? -1 : (int)(v->scopeId < INT_MAX ? v->scopeId : INT_MAX);
    }
    if (d->nvlink.n < 0) return 1; /* no NVLink: NOT_SUPPORTED */
    if (link >= d->nvlink.n) {
        v->nvmlReturn = NVML_ERROR_INVALID_ARGUMENT;
        return 1;
    }
    if (link >= 0) {
        put_ull(v, d->nvc[link][counter]);
        return 1;
    }
    long long sum = 0; /* scopeId UINT_MAX: every link's value summed (nvml.h) */
    for (int l = 0; l < d->nvlink.n; l++) {
        if (d->nvc[l][counter] == UNSET) return 1;
        sum += d->nvc[l][counter];
    }
    put_ull(v, sum);
    return 1;
}
