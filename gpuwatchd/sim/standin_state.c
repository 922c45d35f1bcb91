/*
 * The stand-in's state-file parser: line format in gpuwatchd/sim/state.py. Robust to truncated or garbage files
 * (they parse to NULL and the caller keeps the previous state); unknown keys are ignored for forward compatibility.
 */
#include "standin.h"

#include <errno.h>
#include <unistd.h>

#define READING(fn, type, key, lo, hi) #fn,
const char *const func_names[NFUNCS] = {FUNCS(AS_NAME)
#include "standin_readings.def"
};
#undef READING

/* standin_readings.def: each row's state key (its state-file line) and slot */
#define READING(fn, type, key, lo, hi) {#key, R_##fn},
static const struct {
    const char *key;
    int slot;
} READING_KEYS[NREADINGS] = {
#include "standin_readings.def"
};
#undef READING

void free_dev(sdev *d) {
    free(d->fans.v);
    free(d->nvlink.v);
    free(d->rp[0].v);
    free(d->rp[1].v);
    free(d->proc[0]);
    free(d->proc[1]);
    free(d->putil.v);
    free(d->pcie_lanes.v);
    free_gpm(d);
    free_migs(d); /* standin_mig.c */
}

void free_state(sstate *s) {
    if (!s) return;
    for (int i = 0; i < s->ndev; i++) free_dev(&s->devs[i]);
    free(s->devs);
    free(s->evs);
    free(s);
}

void dev_defaults(sdev *d) {
    memset(d, 0, sizeof(*d));
    long long *unset[] = {&d->temp, &d->pstate, &d->rp_pending, &d->codec[0], &d->codec[1],
                          &d->mig_max, &d->gi, &d->ci, &d->margin};
    for (size_t i = 0; i < sizeof(unset) / sizeof(unset[0]); i++) *unset[i] = UNSET;
    long long *arrs[] = {d->pci, d->mem, d->util, d->tthr, d->pcons, d->clk, d->maxclk, d->viol, d->ecc_mode,
                         d->ecc, d->remap, d->pcie, d->mig, d->fv, d->encstats, d->cc};
    size_t lens[] = {5, 3, 2, 4, 2, 4, 4, NVML_PERF_POLICY_COUNT, 2, 4, 4, 8, 2, FIELD_VALUE_COUNT, 3, 2};
    for (size_t a = 0; a < sizeof(arrs) / sizeof(arrs[0]); a++)
        for (size_t i = 0; i < lens[a]; i++) arrs[a][i] = UNSET;
    for (int i = 0; i < NREADINGS; i++) d->reading[i] = UNSET;
    d->fans.n = d->nvlink.n = d->rp[0].n = d->rp[1].n = -1;
    d->nproc[0] = d->nproc[1] = -1;
    d->putil.n = -1;
    d->pcie_lanes.n = -1;
    d->evtypes = (long long)nvmlEventTypeAll; /* docs/sim-state.md: default is every event bit */
    nvlink_defaults(d);
    fabric_defaults(d);
}

/* Parse whitespace-separated integers ("-" = unset) from s. Returns the count, or -1 on garbage. */
static int parse_nums(char *s, long long *out, int max) {
    int n = 0;
    while (*s) {
        while (*s == ' ') s++;
        if (!*s) break;
        if (n >= max) return -1;
        if (s[0] == '-' && (s[1] == ' ' || s[1] == 0)) {
            out[n++] = UNSET;
            s++;
            continue;
        }
        char *end;
        errno = 0;
        long long v = strtoll(s, &end, 10);
        if (end == s || errno || (*end != ' ' && *end != 0)) return -1;
        out[n++] = v;
        s = end;
    }
    return n;
}

int standin_parse_nums(char *s, long long *out, int max) { return parse_nums(s, out, max); }

static int count_tokens(const char *s) {
    int n = 0, in = 0;
    for (; *s; s++) {
        if (*s == ' ') in = 0;
        else if (!in) { in = 1; n++; }
    }
    return n;
}

/* A list line: "key v1 v2 ..." (possibly empty). Replaces any previous list. */
static int parse_list(char *s, slist *l) {
    int cap = count_tokens(s);
    long long *v = malloc(sizeof(long long) * (size_t)(cap ? cap : 1));
    if (!v) return -1;
    int n = parse_nums(s, v, cap);
    if (n < 0) { free(v); return -1; }
    for (int i = 0; i < n; i++)
        if (v[i] == UNSET) { free(v); return -1; }
    free(l->v);
    l->v = v;
    l->n = n;
    return 0;
}

static int parse_fixed(char *s, long long *out, int want) {
    long long tmp[16];
    if (parse_nums(s, tmp, 16) != want) return -1;
    memcpy(out, tmp, sizeof(long long) * (size_t)want);
    return 0;
}

static int parse_procs(char *s, sdev *d, int kind) {
    int ntok = count_tokens(s);
    if (ntok % 2) return -1;
    long long *v = malloc(sizeof(long long) * (size_t)(ntok ? ntok : 1));
    if (!v) return -1;
    if (parse_nums(s, v, ntok) != ntok) { free(v); return -1; }
    sproc *p = malloc(sizeof(sproc) * (size_t)(ntok ? ntok / 2 : 1));
    if (!p) { free(v); return -1; }
    for (int i = 0; i < ntok / 2; i++) {
        if (v[2 * i] == UNSET || v[2 * i] < 0) { free(v); free(p); return -1; }
        p[i].pid = (unsigned int)v[2 * i];
        p[i].used = v[2 * i + 1];
    }
    free(v);
    free(d->proc[kind]);
    d->proc[kind] = p;
    d->nproc[kind] = ntok / 2;
    return 0;
}

static int func_id(const char *name) {
    for (int i = 0; i < NFUNCS; i++)
        if (strcmp(func_names[i], name) == 0) return i;
    return -1;
}

/* "error <symbol|*> <code>" / "delay <symbol|*> <ms>"; unknown symbols are ignored (written by a newer writer). */
static int parse_override(char *s, sdev *d, int is_delay) {
    char *sp = strchr(s, ' ');
    if (!sp) return -1;
    *sp = 0;
    long long v;
    if (parse_nums(sp + 1, &v, 1) != 1 || v == UNSET) return -1;
    d->has_overrides = 1;
    if (strcmp(s, "*") == 0) {
        if (is_delay) d->delay_all = (int)v;
        else d->err_all = (int)v;
        return 0;
    }
    int id = func_id(s);
    if (id >= 0) {
        if (is_delay) d->delay[id] = (int)v;
        else d->err[id] = (int)v;
    }
    return 0;
}

/* A line of standin_readings.def's state keys: 1 set (every row of that key), 0 not such a key, -1 malformed. */
static int parse_reading(sdev *d, const char *key, char *a) {
    int hit = 0;
    long long v;
    for (int i = 0; i < NREADINGS; i++) {
        if (strcmp(READING_KEYS[i].key, key)) continue;
        if (!hit && parse_fixed(a, &v, 1)) return -1;
        d->reading[READING_KEYS[i].slot] = v;
        hit = 1;
    }
    return hit;
}

int parse_device_line(sdev *d, const char *key, char *a) {
    int r = parse_reading(d, key, a);
    if (r) return r < 0 ? -1 : 0;
    if (!strcmp(key, "uuid")) copy_str(d->uuid, sizeof d->uuid, a);
    else if (!strcmp(key, "name")) copy_str(d->name, sizeof d->name, a);
    else if (!strcmp(key, "serial")) { copy_str(d->serial, sizeof d->serial, a); d->has_serial = 1; }
    else if (!strcmp(key, "pci")) return parse_fixed(a, d->pci, 5);
    else if (!strcmp(key, "memory")) return parse_fixed(a, d->mem, 3);
    else if (!strcmp(key, "utilization")) return parse_fixed(a, d->util, 2);
    else if (!strcmp(key, "temperature")) return parse_fixed(a, &d->temp, 1);
    else if (!strcmp(key, "temperature_thresholds")) return parse_fixed(a, d->tthr, 4);
    else if (!strcmp(key, "power_constraints")) return parse_fixed(a, d->pcons, 2);
    else if (!strcmp(key, "cuda_compute_capability")) return parse_fixed(a, d->cc, 2);
    else if (!strcmp(key, "encoder_utilization")) return parse_fixed(a, &d->codec[0], 1);
    else if (!strcmp(key, "decoder_utilization")) return parse_fixed(a, &d->codec[1], 1);
    else if (!strcmp(key, "field_values")) return parse_fixed(a, d->fv, FIELD_VALUE_COUNT);
    else if (!strcmp(key, "pcie_lane_errors"))
        return parse_list(a, &d->pcie_lanes) || d->pcie_lanes.n > PCIE_MAX_LANES ? -1 : 0;
    else if (!strcmp(key, "temperature_margin")) return parse_fixed(a, &d->margin, 1);
    else if (!strcmp(key, "encoder_stats")) return parse_fixed(a, d->encstats, 3);
    else if (!strcmp(key, "clocks")) return parse_fixed(a, d->clk, 4);
    else if (!strcmp(key, "max_clocks")) return parse_fixed(a, d->maxclk, 4);
    else if (!strcmp(key, "violation")) {
        /* power thermal sync_boost board_limit low_utilization reliability total_app total_base */
        long long v[8];
        if (parse_fixed(a, v, 8)) return -1;
        for (int i = 0; i < 6; i++) d->viol[i] = v[i];
        d->viol[NVML_PERF_POLICY_TOTAL_APP_CLOCKS] = v[6];
        d->viol[NVML_PERF_POLICY_TOTAL_BASE_CLOCKS] = v[7];
    } else if (!strcmp(key, "pstate")) return parse_fixed(a, &d->pstate, 1);
    else if (!strcmp(key, "fans")) return parse_list(a, &d->fans);
    else if (!strcmp(key, "ecc_mode")) return parse_fixed(a, d->ecc_mode, 2);
    else if (!strcmp(key, "ecc_errors")) return parse_fixed(a, d->ecc, 4);
    else if (!strcmp(key, "retired_pending")) return parse_fixed(a, &d->rp_pending, 1);
    else if (!strcmp(key, "retired_sbe")) return parse_list(a, &d->rp[0]);
    else if (!strcmp(key, "retired_dbe")) return parse_list(a, &d->rp[1]);
    else if (!strcmp(key, "remapped_rows")) return parse_fixed(a, d->remap, 4);
    else if (!strcmp(key, "pcie")) return parse_fixed(a, d->pcie, 8);
    else if (!strcmp(key, "nvlink")) return parse_list(a, &d->nvlink);
    else if (!strcmp(key, "nvlink_counters")) return parse_nvlink_counters(d, a);
    else if (!strcmp(key, "recovery_action")) return parse_fixed(a, &d->recovery_action, 1);
    else if (!strcmp(key, "fabric")) return parse_fixed(a, d->fabric, 5) || d->fabric[0] == UNSET ? -1 : 0;
    else if (!strcmp(key, "fabric_cluster")) return parse_fabric_cluster(d, a);
    else if (!strcmp(key, "p2p") || !strcmp(key, "p2p_default")) {
        long long v[P2P_CAPS + 1];
        int peer_line = !strcmp(key, "p2p");
        v[0] = -1;
        if (parse_fixed(a, peer_line ? v : v + 1, peer_line ? P2P_CAPS + 1 : P2P_CAPS)) return -1;
        return v[0] == UNSET ? -1 : parse_p2p(d, v[0], v + 1);
    }
    else if (!strcmp(key, "mig_mode")) return parse_fixed(a, d->mig, 2);
    else if (!strcmp(key, "supported_event_types")) return parse_fixed(a, &d->evtypes, 1);
    else if (!strcmp(key, "processes_compute")) return parse_procs(a, d, 0);
    else if (!strcmp(key, "processes_graphics")) return parse_procs(a, d, 1);
    else if (!strcmp(key, "process_utilization")) return parse_list(a, &d->putil) || d->putil.n % 8 ? -1 : 0;
    else if (!strcmp(key, "lost")) { long long v; if (parse_fixed(a, &v, 1)) return -1; d->lost = v == 1; }
    else if (!strncmp(key, "gpm", 3)) return parse_gpm_line(d, key, a);
    else if (!strcmp(key, "error")) return parse_override(a, d, 0);
    else if (!strcmp(key, "delay")) return parse_override(a, d, 1);
    /* unknown keys: ignored, so an older stand-in tolerates a newer writer */
    return 0;
}

static int parse_event(sstate *s, char *a) {
    /* "event <seq> <type bits> <data> <uuid>" */
    char *p = a;
    long long v[3];
    for (int i = 0; i < 3; i++) {
        char *sp = strchr(p, ' ');
        if (!sp) return -1;
        *sp = 0;
        if (parse_nums(p, &v[i], 1) != 1 || v[i] == UNSET || v[i] < 0) return -1;
        p = sp + 1;
    }
    if (s->nev == s->cap_ev) {
        int cap = s->cap_ev ? s->cap_ev * 2 : 16;
        sevent *e = realloc(s->evs, sizeof(sevent) * (size_t)cap);
        if (!e) return -1;
        s->evs = e;
        s->cap_ev = cap;
    }
    sevent *e = &s->evs[s->nev++];
    e->seq = (unsigned long long)v[0];
    e->type = (unsigned long long)v[1];
    e->data = (unsigned long long)v[2];
    copy_str(e->uuid, sizeof e->uuid, p);
    if (e->seq > s->max_seq) s->max_seq = e->seq;
    return 0;
}

/* Parse a whole state file; NULL when it is missing, truncated (no END line) or malformed. */
sstate *parse_state(int fd) {
    int dupfd = dup(fd);
    FILE *f = dupfd >= 0 ? fdopen(dupfd, "r") : NULL;
    if (!f) {
        if (dupfd >= 0) close(dupfd);
        return NULL;
    }
    sstate *s = calloc(1, sizeof(sstate));
    char *line = NULL;
    size_t cap = 0;
    ssize_t len;
    int ok = 0, first = 1, in_dev = 0;
    if (!s) goto out;
    s->cuda = UNSET;
    while ((len = getline(&line, &cap, f)) >= 0) {
        if (len && line[len - 1] == '\n') line[--len] = 0;
        if (first) {
            if (strcmp(line, STATE_MAGIC) != 0) goto out;
            first = 0;
            continue;
        }
        if (!strcmp(line, "END")) { ok = !in_dev; break; }
        if (line[0] == '#' || line[0] == 0) continue;
        char *a = strchr(line, ' ');
        if (a) *a++ = 0;
        else a = line + len; /* key without arguments: empty string */
        if (!strcmp(line, "device")) {
            if (in_dev || s->ndev >= MAX_DEVICES) goto out;
            if (s->ndev == s->cap_dev) {
                int c = s->cap_dev ? s->cap_dev * 2 : 8;
                sdev *d = realloc(s->devs, sizeof(sdev) * (size_t)c);
                if (!d) goto out;
                s->devs = d;
                s->cap_dev = c;
            }
            dev_defaults(&s->devs[s->ndev++]);
            in_dev = 1;
        } else if (!strcmp(line, "end_device")) {
            if (!in_dev || !s->devs[s->ndev - 1].uuid[0] || s->devs[s->ndev - 1].mig_open) goto out;
            in_dev = 0;
        } else if (in_dev) {
            int m = parse_mig_line(&s->devs[s->ndev - 1], line, a); /* standin_mig.c: mig_device blocks */
            if (m < 0 || (m == 0 && parse_device_line(&s->devs[s->ndev - 1], line, a))) goto out;
        } else if (!strcmp(line, "driver_version")) copy_str(s->driver, sizeof s->driver, a);
        else if (!strcmp(line, "nvml_version")) copy_str(s->nvml, sizeof s->nvml, a);
        else if (!strcmp(line, "cuda_driver_version")) { if (parse_fixed(a, &s->cuda, 1)) goto out; }
        else if (!strcmp(line, "init_error")) {
            long long v;
            if (parse_fixed(a, &v, 1) || v == UNSET) goto out;
            s->init_error = (int)v;
        } else if (!strcmp(line, "clock")) s->clock = strtod(a, NULL);
        else if (!strcmp(line, "event")) { if (parse_event(s, a)) goto out; }
    }
out:
    free(line);
    fclose(f);
    if (!ok) {
        free_state(s);
        return NULL;
    }
    return s;
}
