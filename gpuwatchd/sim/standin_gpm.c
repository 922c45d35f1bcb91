/*
 * The stand-in's GPM calls (nvml.h "GPM Functions"): device support, sample buffers, device and MIG-instance
 * samples, and metrics computed from two samples.
 *
 * A state gives a device its GPM activity as the metrics' own values ("gpm" line: percent or MiB/s, in millionths;
 * gpuwatchd/sim/state.py). Like the hardware's counters, a sample does not hold those values: it holds a timestamp
 * and cumulative counters (each value integrated over time since the device was first sampled, per device and GPU
 * instance), and nvmlGpmMetricsGet divides the counters' difference by the time between the two samples. So a
 * caller that passes one sample twice, samples of two devices, or samples in the wrong order gets an error, and a
 * value that changed between two samples comes out as its time-weighted mean, as on real hardware.
 */
#include "standin.h"

#define EXPORT __attribute__((visibility("default")))
#define GPM_MAGIC 0x47504d53u
/* Helpers only the exported calls use: a build that omits every call must still compile cleanly. */
#define CALL_HELPER __attribute__((unused)) static
#define GPM_MAX_INSTANCES 8 /* a Hopper GPU has at most 7 GPU instances */

/* The metrics the stand-in serves, in the order of the state line (gpuwatchd/sim/state.py GPM_METRICS). */
static const struct {
    unsigned int id;
    const char *short_name, *long_name, *unit;
} GPM_METRICS[] = {
    {NVML_GPM_METRIC_GRAPHICS_UTIL, "graphics_util", "Graphics and compute engine activity", "%"},
    {NVML_GPM_METRIC_SM_UTIL, "sm_util", "SM activity", "%"},
    {NVML_GPM_METRIC_SM_OCCUPANCY, "sm_occupancy", "SM occupancy", "%"},
    {NVML_GPM_METRIC_INTEGER_UTIL, "integer_util", "Integer pipe activity", "%"},
    {NVML_GPM_METRIC_ANY_TENSOR_UTIL, "any_tensor_util", "Any tensor pipe activity", "%"},
    {NVML_GPM_METRIC_DFMA_TENSOR_UTIL, "dfma_tensor_util", "DFMA tensor pipe activity", "%"},
    {NVML_GPM_METRIC_HMMA_TENSOR_UTIL, "hmma_tensor_util", "HMMA tensor pipe activity", "%"},
    {NVML_GPM_METRIC_DMMA_TENSOR_UTIL, "dmma_tensor_util", "DMMA tensor pipe activity", "%"},
    {NVML_GPM_METRIC_IMMA_TENSOR_UTIL, "imma_tensor_util", "IMMA tensor pipe activity", "%"},
    {NVML_GPM_METRIC_DRAM_BW_UTIL, "dram_bw_util", "DRAM bandwidth utilization", "%"},
    {NVML_GPM_METRIC_FP64_UTIL, "fp64_util", "FP64 pipe activity", "%"},
    {NVML_GPM_METRIC_FP32_UTIL, "fp32_util", "FP32 pipe activity", "%"},
    {NVML_GPM_METRIC_FP16_UTIL, "fp16_util", "FP16 pipe activity", "%"},
    {NVML_GPM_METRIC_PCIE_TX_PER_SEC, "pcie_tx_per_sec", "PCIe transmit rate", "MiB/sec"},
    {NVML_GPM_METRIC_PCIE_RX_PER_SEC, "pcie_rx_per_sec", "PCIe receive rate", "MiB/sec"},
    {NVML_GPM_METRIC_NVLINK_TOTAL_RX_PER_SEC, "nvlink_total_rx_per_sec", "NVLink receive rate, all links", "MiB/sec"},
    {NVML_GPM_METRIC_NVLINK_TOTAL_TX_PER_SEC, "nvlink_total_tx_per_sec", "NVLink transmit rate, all links",
     "MiB/sec"},
};
#define NV ((int)(sizeof(GPM_METRICS) / sizeof(GPM_METRICS[0])))

typedef struct {
    long long gi;     /* GPU instance id; -1: the whole device */
    long long v[NV];  /* millionths of the metric's unit; UNSET: the metric is not supported */
} sgpm_set;

struct sgpm {
    int supported; /* nvmlGpmSupport_t.isSupportedDevice */
    int n;         /* sets in use: set[0] is the device, then its GPU instances */
    sgpm_set set[1 + GPM_MAX_INSTANCES];
    int merr[NV]; /* per-metric nvmlReturn_t the metrics call answers (0: none) */
};

struct nvmlGpmSample_st {
    unsigned int magic;
    int filled;
    char uuid[NVML_DEVICE_UUID_V2_BUFFER_SIZE];
    long long gi;
    double t;        /* CLOCK_MONOTONIC seconds */
    int have[NV];    /* the metric was supported when sampled */
    double acc[NV];  /* cumulative: value x seconds */
};

/* Cumulative counters per (device UUID, GPU instance); guarded by the state mutex like everything else. */
typedef struct {
    char uuid[NVML_DEVICE_UUID_V2_BUFFER_SIZE];
    long long gi;
    double t;
    double acc[NV];
} gpm_counter;
static gpm_counter *counters;
static int ncounters, capcounters;

/* ------------------------------------------------------------------------------------------------ state lines */

static int parse_values(char *s, long long *out, int want) { return standin_parse_nums(s, out, want) == want ? 0 : -1; }

static int metric_index(unsigned int id) {
    for (int k = 0; k < NV; k++)
        if (GPM_METRICS[k].id == id) return k;
    return -1;
}

/* "gpm <supported> <NV values>", then "gpm_instance <gi> <NV values>" and "gpm_metric_error <metric id> <code>". */
int parse_gpm_line(sdev *d, const char *key, char *a) {
    long long v[1 + NV];
    if (!strcmp(key, "gpm")) {
        if (parse_values(a, v, 1 + NV) || v[0] == UNSET) return -1;
        if (!d->gpm && !(d->gpm = calloc(1, sizeof(struct sgpm)))) return -1;
        d->gpm->supported = v[0] != 0;
        d->gpm->n = d->gpm->n ? d->gpm->n : 1;
        d->gpm->set[0].gi = -1;
        memcpy(d->gpm->set[0].v, v + 1, sizeof(long long) * NV);
    } else if (!strcmp(key, "gpm_instance")) {
        if (!d->gpm || parse_values(a, v, 1 + NV) || v[0] == UNSET || v[0] < 0) return -1;
        if (d->gpm->n >= 1 + GPM_MAX_INSTANCES) return -1;
        sgpm_set *set = &d->gpm->set[d->gpm->n++];
        set->gi = v[0];
        memcpy(set->v, v + 1, sizeof(long long) * NV);
    } else if (!strcmp(key, "gpm_metric_error")) {
        int k;
        if (!d->gpm || parse_values(a, v, 2) || v[0] == UNSET || v[1] == UNSET) return -1;
        if ((k = metric_index((unsigned int)v[0])) < 0) return -1;
        d->gpm->merr[k] = (int)v[1];
    }
    return 0; /* other gpm* keys: a newer writer's, ignored */
}

void free_gpm(sdev *d) {
    free(d->gpm);
    d->gpm = NULL;
}

/* ------------------------------------------------------------------------------------------------ helpers */

CALL_HELPER double mono_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

CALL_HELPER int sample_ok(nvmlGpmSample_t s) { return s != NULL && s->magic == GPM_MAGIC; }

/* With the mutex held: advance the (uuid, gi) counters to now at the set's current values, copy them into s. */
CALL_HELPER nvmlReturn_t take_sample(const sdev *d, const sgpm_set *set, nvmlGpmSample_t s) {
    gpm_counter *c = NULL;
    for (int i = 0; i < ncounters && !c; i++)
        if (counters[i].gi == set->gi && !strcmp(counters[i].uuid, d->uuid)) c = &counters[i];
    double now = mono_s();
    if (!c) {
        if (ncounters == capcounters) {
            int cap = capcounters ? capcounters * 2 : 16;
            gpm_counter *n = realloc(counters, sizeof(gpm_counter) * (size_t)cap);
            if (!n) return leave(NVML_ERROR_MEMORY);
            counters = n;
            capcounters = cap;
        }
        c = &counters[ncounters++];
        memset(c, 0, sizeof(*c));
        copy_str(c->uuid, sizeof c->uuid, d->uuid);
        c->gi = set->gi;
        c->t = now;
    }
    double dt = now - c->t;
    for (int k = 0; k < NV; k++) {
        if (set->v[k] != UNSET) c->acc[k] += (double)set->v[k] * 1e-6 * dt;
        s->have[k] = set->v[k] != UNSET;
        s->acc[k] = c->acc[k];
    }
    c->t = now;
    copy_str(s->uuid, sizeof s->uuid, d->uuid);
    s->gi = set->gi;
    s->t = now;
    s->filled = 1;
    return leave(NVML_SUCCESS);
}

/* ------------------------------------------------------------------------------------------------ calls */

#ifndef OMIT_nvmlGpmQueryDeviceSupport
EXPORT nvmlReturn_t nvmlGpmQueryDeviceSupport(nvmlDevice_t device, nvmlGpmSupport_t *gpmSupport) {
    sdev *d;
    nvmlReturn_t r = enter_dev(F_nvmlGpmQueryDeviceSupport, device, gpmSupport != NULL, &d);
    if (r) return r;
    if (gpmSupport->version != NVML_GPM_SUPPORT_VERSION) return leave(NVML_ERROR_ARGUMENT_VERSION_MISMATCH);
    /* A driver with GPM answers for every GPU; pre-Hopper ones are simply not supported devices. */
    gpmSupport->isSupportedDevice = d->gpm != NULL && d->gpm->supported;
    return leave(NVML_SUCCESS);
}
#endif

#ifndef OMIT_nvmlGpmSampleAlloc
EXPORT nvmlReturn_t nvmlGpmSampleAlloc(nvmlGpmSample_t *gpmSample) {
    if (!gpmSample) return NVML_ERROR_INVALID_ARGUMENT;
    nvmlReturn_t r = enter_lib();
    if (r) return r;
    nvmlGpmSample_t s = calloc(1, sizeof(*s));
    if (!s) return leave(NVML_ERROR_MEMORY);
    s->magic = GPM_MAGIC;
    *gpmSample = s;
    return leave(NVML_SUCCESS);
}
#endif

#ifndef OMIT_nvmlGpmSampleFree
EXPORT nvmlReturn_t nvmlGpmSampleFree(nvmlGpmSample_t gpmSample) {
    if (!sample_ok(gpmSample)) return NVML_ERROR_INVALID_ARGUMENT;
    nvmlReturn_t r = enter_lib();
    if (r) return r;
    gpmSample->magic = 0;
    free(gpmSample);
    return leave(NVML_SUCCESS);
}
#endif

#ifndef OMIT_nvmlGpmSampleGet
EXPORT nvmlReturn_t nvmlGpmSampleGet(nvmlDevice_t device, nvmlGpmSample_t gpmSample) {
    sdev *d;
    nvmlReturn_t r = enter_dev(F_nvmlGpmSampleGet, device, sample_ok(gpmSample), &d);
    if (r) return r;
    if (!d->gpm || !d->gpm->supported) return leave(NVML_ERROR_NOT_SUPPORTED);
    return take_sample(d, &d->gpm->set[0], gpmSample);
}
#endif

#ifndef OMIT_nvmlGpmMigSampleGet
EXPORT nvmlReturn_t nvmlGpmMigSampleGet(nvmlDevice_t device, unsigned int gpuInstanceId, nvmlGpmSample_t gpmSample) {
    sdev *d;
    nvmlReturn_t r = enter_dev(F_nvmlGpmMigSampleGet, device, sample_ok(gpmSample), &d);
    if (r) return r;
    if (!d->gpm || !d->gpm->supported) return leave(NVML_ERROR_NOT_SUPPORTED);
    for (int i = 1; i < d->gpm->n; i++)
        if (d->gpm->set[i].gi == (long long)gpuInstanceId) return take_sample(d, &d->gpm->set[i], gpmSample);
    return leave(NVML_ERROR_NOT_FOUND); /* no such GPU instance (nvmlDeviceGetGpuInstanceById's answer) */
}
#endif

#ifndef OMIT_nvmlGpmMetricsGet
EXPORT nvmlReturn_t nvmlGpmMetricsGet(nvmlGpmMetricsGet_t *metricsGet) {
    if (!metricsGet) return NVML_ERROR_INVALID_ARGUMENT;
    nvmlReturn_t r = enter_lib();
    if (r) return r;
    if (metricsGet->version != NVML_GPM_METRICS_GET_VERSION) return leave(NVML_ERROR_ARGUMENT_VERSION_MISMATCH);
    nvmlGpmSample_t a = metricsGet->sample1, b = metricsGet->sample2;
    if (metricsGet->numMetrics > NVML_GPM_METRIC_MAX || !sample_ok(a) || !sample_ok(b) || a == b || !a->filled ||
        !b->filled || a->gi != b->gi || strcmp(a->uuid, b->uuid) || !(b->t > a->t))
        return leave(NVML_ERROR_INVALID_ARGUMENT); /* not two samples of one device in time order */
    const sdev *d = state_dev(a->uuid);
    if (d && d->has_overrides && d->err[F_nvmlGpmMetricsGet]) return leave((nvmlReturn_t)d->err[F_nvmlGpmMetricsGet]);
    double dt = b->t - a->t;
    for (unsigned int i = 0; i < metricsGet->numMetrics; i++) {
        nvmlGpmMetric_t *m = &metricsGet->metrics[i];
        int k = metric_index(m->metricId);
        m->value = 0;
        m->metricInfo.shortName = m->metricInfo.longName = m->metricInfo.unit = NULL;
        if (k < 0 || !a->have[k] || !b->have[k]) {
            m->nvmlReturn = NVML_ERROR_NOT_SUPPORTED;
            continue;
        }
        m->metricInfo.shortName = (char *)GPM_METRICS[k].short_name;
        m->metricInfo.longName = (char *)GPM_METRICS[k].long_name;
        m->metricInfo.unit = (char *)GPM_METRICS[k].unit;
        if (d && d->gpm && d->gpm->merr[k]) {
            m->nvmlReturn = (nvmlReturn_t)d->gpm->merr[k];
            continue;
        }
        m->value = (b->acc[k] - a->acc[k]) / dt;
        m->nvmlReturn = NVML_SUCCESS;
    }
    return leave(NVML_SUCCESS);
}
#endif
