/*
 * The simulated device model.
 *
 * Gauges are pure functions of scenario time t (ns since scenario start):
 *   util(t)      = clamp(util pattern, 0, 100)
 *   mem_util(t)  = mem_util pattern if given, else util(t) / 2
 *   power(t)     = demand = power pattern if given, else idle + (max - idle) * util(t) / 100;
 *                  clocks and power move together (operating_point): the clock factor f
 *                  of the active throttle windows (and the thermal factor while
 *                  temperature >= slowdown) scales the dynamic power, idle + (demand -
 *                  idle) * f; a cap (the enforced limit, or a window's cap) below that
 *                  lowers f until the power fits and sets SwPowerCap
 *   sm clock(t)  = util(t) > 0 ? max(sm_clock_max * f, sm_clock_idle) : sm_clock_idle
 *   mem used(t)  = sum of the alive processes' memory + mem_used pattern (bytes)
 * Cumulative values (energy, per-reason throttle ns, PCIe/NVLink bytes) and the
 * temperature (first-order lag towards ambient + power * c_per_w with time constant
 * tau, starting from the idle temperature ambient + idle_power * c_per_w; it never exceeds
 * the shutdown temperature: reaching it powers the board off and loses the GPU) are
 * integrated on a fixed 10 ms grid with the midpoint rule, which is exact for
 * piecewise-constant and piecewise-linear inputs whose breakpoints lie on the grid.
 *
 * Patterns (t_s = seconds since scenario start):
 *   constant a
 *   square   a=high b=low c=period d=low_s e=offset: low while (t-e) mod c < d, else high
 *   ramp     a=from b=to c=start d=duration: linear between start and start+duration
 *   bursts   a=base b=peak c=period d=burst seed: in period k = floor(t/c) the burst starts
 *            at k*c + u_k*(c-d), u_k = (splitmix64(seed + k) >> 11) * 2^-53
 *   steps    (t_i, v_i): v_i for the last t_i <= t (v_0 before t_0)
 *
 * Every function here expects g_sim.lock to be held.
 */
#include <math.h>
#include <string.h>
#include <time.h>

#include "sim.h"

static uint64_t splitmix64(uint64_t x) {
    uint64_t z = x + 0x9E3779B97F4A7C15ULL;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}

long long sim_now_ns(void) {
    if (g_sim.virtual_clock) return g_sim.virtual_ns;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    long long now = (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec - g_sim.epoch_ns;
    return now < 0 ? 0 : now;
}

long long sim_epoch_us(long long t_ns) { return (g_sim.epoch_ns + t_ns) / 1000; }

double sim_pattern_eval(const sim_pattern *p, double t) {
    switch (p->kind) {
    case PAT_CONSTANT:
        return p->a;
    case PAT_SQUARE: {
        double phase = fmod(t - p->e, p->c);
        if (phase < 0) phase += p->c;
        return phase < p->d ? p->b : p->a;
    }
    case PAT_RAMP:
        if (t < p->c) return p->a;
        if (t >= p->c + p->d || p->d <= 0) return p->b;
        return p->a + (p->b - p->a) * (t - p->c) / p->d;
    case PAT_BURSTS: {
        double k = floor(t / p->c);
        double u = (double)(splitmix64(p->seed + (uint64_t)(long long)k) >> 11) * 0x1.0p-53;
        double start = k * p->c + u * (p->c - p->d);
        return (t >= start && t < start + p->d) ? p->b : p->a;
    }
    case PAT_STEPS: {
        double v = p->step_v[0];
        for (int i = 0; i < p->nsteps && p->step_t[i] <= t; i++) v = p->step_v[i];
        return v;
    }
    default:
        return 0.0;
    }
}

static double clampd(double v, double lo, double hi) { return v < lo ? lo : (v > hi ? hi : v); }

static int event_active(const sim_event *e, int gpu, long long t) {
    return (e->gpu == gpu || e->gpu == -1) && t >= e->start_ns && t < e->start_ns + e->dur_ns;
}

double sim_util_gpu(int gpu, long long t) {
    return clampd(sim_pattern_eval(&g_sim.gpu[gpu].util, (double)t / 1e9), 0.0, 100.0);
}

double sim_util_mem(int gpu, long long t) {
    const sim_gpu_config *g = &g_sim.gpu[gpu];
    if (g->mem_util.kind == PAT_NONE) return sim_util_gpu(gpu, t) / 2.0;
    return clampd(sim_pattern_eval(&g->mem_util, (double)t / 1e9), 0.0, 100.0);
}

/* Raw power demand at full clocks (the load's need). */
static double power_demand(int gpu, long long t) {
    const sim_gpu_config *g = &g_sim.gpu[gpu];
    double d;
    if (g->power.kind != PAT_NONE)
        d = sim_pattern_eval(&g->power, (double)t / 1e9);
    else
        d = g->idle_power_w + (g->max_power_w - g->idle_power_w) * sim_util_gpu(gpu, t) / 100.0;
    return d < 0 ? 0 : d;
}

/* The power cap in force at t: the enforced limit, lowered by any throttle window's cap. */
static double power_cap(int gpu, long long t) {
    double c = g_sim.gpu[gpu].power_limit_mw / 1000.0;
    for (int k = 0; k < g_sim.n_throttle; k++) {
        const sim_event *e = &g_sim.events[g_sim.idx_throttle[k]];
        if (e->c > 0 && event_active(e, gpu, t) && e->c < c) c = e->c;
    }
    return c;
}

/*
 * The operating point at t with the board at temperature temp_c: reasons, clock factor
 * and power, which move together as on a real board:
 *   - throttle windows and thermal slowdown lower the clocks (factor f), and the dynamic
 *     power (above idle) falls with them: p = idle + (demand - idle) * f;
 *   - a power cap below that lowers the clocks until the power fits:
 *     f *= (cap - idle) / (p - idle), p = cap (SwPowerCap);
 *   - a board that reached its shutdown temperature is off (lost): no power.
 */
static unsigned long long operating_point(int gpu, long long t, double temp_c, double *factor,
                                          double *power) {
    const sim_gpu_config *g = &g_sim.gpu[gpu];
    unsigned long long r = 0;
    double f = 1.0;
    if (sim_util_gpu(gpu, t) <= 0.0) r |= REASON_GPU_IDLE;
    for (int k = 0; k < g_sim.n_throttle; k++) {
        const sim_event *e = &g_sim.events[g_sim.idx_throttle[k]];
        if (!event_active(e, gpu, t)) continue;
        r |= (unsigned long long)e->a;
        if (e->b < f) f = e->b;
    }
    if (g->slowdown_c > 0 && temp_c >= g->slowdown_c) {
        r |= REASON_SW_THERMAL;
        if (g->thermal_clock_factor < f) f = g->thermal_clock_factor;
    }
    double demand = power_demand(gpu, t), idle = g->idle_power_w;
    double p = demand > idle ? idle + (demand - idle) * f : demand;
    double cap = power_cap(gpu, t);
    if (p > cap) {
        r |= REASON_SW_POWER_CAP;
        f *= (p > idle && cap > idle) ? (cap - idle) / (p - idle) : 0.0;
        p = cap;
    }
    if (g_sim.thermal_lost_ns[gpu] >= 0 && t >= g_sim.thermal_lost_ns[gpu]) p = 0.0;
    if (r & (REASON_HW_THERMAL | REASON_HW_POWER_BRAKE)) r |= REASON_HW_SLOWDOWN;
    if (factor) *factor = f;
    if (power) *power = p;
    return r & REASON_SUPPORTED;
}

/* An injected thermal throttle (hw_thermal, sw_thermal) stands for a cooling fault (a
 * failed fan, a hot inlet): while it lasts the board heats towards its slowdown limit,
 * so the temperature says why the clocks fell, as on a real board. */
static int injected_thermal(int gpu, long long t) {
    for (int k = 0; k < g_sim.n_throttle; k++) {
        const sim_event *e = &g_sim.events[g_sim.idx_throttle[k]];
        if (event_active(e, gpu, t) &&
            ((unsigned long long)e->a & (REASON_HW_THERMAL | REASON_SW_THERMAL)))
            return 1;
    }
    return 0;
}

double sim_power_w(int gpu, long long t) {
    double p;
    operating_point(gpu, t, g_sim.integ[gpu].temp_c, NULL, &p);
    return p;
}

unsigned long long sim_reasons(int gpu, long long t) {
    return operating_point(gpu, t, g_sim.integ[gpu].temp_c, NULL, NULL);
}

double sim_clock_factor(int gpu, long long t) {
    double f;
    operating_point(gpu, t, g_sim.integ[gpu].temp_c, &f, NULL);
    return f;
}

unsigned int sim_sm_clock(int gpu, long long t) {
    const sim_gpu_config *g = &g_sim.gpu[gpu];
    if (sim_util_gpu(gpu, t) <= 0.0) return g->sm_clock_idle;
    unsigned int mhz = (unsigned int)lround(g->sm_clock_max * sim_clock_factor(gpu, t));
    return mhz > g->sm_clock_idle ? mhz : g->sm_clock_idle; /* clocks never go below idle */
}

int sim_proc_alive(const sim_proc *p, long long t) {
    return t >= p->start_ns && (p->end_ns < 0 || t < p->end_ns);
}

unsigned long long sim_mem_used(int gpu, long long t) {
    const sim_gpu_config *g = &g_sim.gpu[gpu];
    double used = 0;
    for (int i = 0; i < g_sim.nprocs; i++)
        if (g_sim.procs[i].gpu == gpu && sim_proc_alive(&g_sim.procs[i], t))
            used += (double)g_sim.procs[i].mem_bytes;
    if (g->mem_used.kind != PAT_NONE) used += sim_pattern_eval(&g->mem_used, (double)t / 1e9);
    double cap = (double)(g->memory_bytes - g->reserved_bytes);
    return (unsigned long long)clampd(used, 0.0, cap);
}

static void integ_reset(int gpu) {
    const sim_gpu_config *g = &g_sim.gpu[gpu];
    sim_integ *s = &g_sim.integ[gpu];
    memset(s, 0, sizeof(*s));
    /* the board was idle before the scenario started */
    s->temp_c = g->ambient_c + g->idle_power_w * g->thermal_c_per_w;
}

/* After a new scenario: fresh counters, and no board has shut down yet. */
void sim_reset_integration(void) {
    for (int i = 0; i < SIM_MAX_GPUS; i++) g_sim.thermal_lost_ns[i] = -1;
    for (int i = 0; i < g_sim.gpu_count; i++) integ_reset(i);
}

/* The board reached its shutdown temperature at t: it powers off and falls off the bus
 * (GPU_IS_LOST from then on, Xid 79 delivered), like a real thermal shutdown, which only
 * a reboot undoes -- the loss stays even if the virtual clock is set back. */
static void thermal_shutdown(int gpu, long long t) {
    g_sim.thermal_lost_ns[gpu] = t;
    if (g_sim.nevents >= SIM_MAX_EVENTS) return;
    sim_event *e = &g_sim.events[g_sim.nevents++];
    memset(e, 0, sizeof(*e));
    e->gpu = gpu;
    e->kind = EV_LOST;
    e->start_ns = t;
    sim_index_events();
    sim_events_notify();
}

void sim_integrate(int gpu, long long t) {
    sim_integ *s = &g_sim.integ[gpu];
    const sim_gpu_config *g = &g_sim.gpu[gpu];
    if (t < s->t_ns) {
        /* wall clock stepped back (NTP): counters stay monotonic, they just pause */
        if (!g_sim.virtual_clock) return;
        integ_reset(gpu); /* virtual clock set back: recompute from 0 */
    }
    while (s->t_ns < t) {
        long long a = s->t_ns;
        long long b = (a / SIM_STEP_NS + 1) * SIM_STEP_NS;
        if (b > t) b = t;
        long long m = a + (b - a) / 2;
        double dt = (double)(b - a) / 1e9;
        double p, u = sim_util_gpu(gpu, m) / 100.0;
        unsigned long long r = operating_point(gpu, m, s->temp_c, NULL, &p);
        s->energy_mj += p * dt * 1000.0;
        for (int bit = 0; bit < 10; bit++)
            if (r & (1ULL << bit)) s->throttle_ns[bit] += (double)(b - a);
        s->pcie_tx_bytes += g->pcie_tx_bps * u * dt;
        s->pcie_rx_bytes += g->pcie_rx_bps * u * dt;
        s->nvlink_tx_bytes += g->nvlink_tx_bps * u * dt;
        s->nvlink_rx_bytes += g->nvlink_rx_bps * u * dt;
        double target = g->ambient_c + p * g->thermal_c_per_w;
        if (g->slowdown_c > 0 && target < g->slowdown_c + 2.0 && injected_thermal(gpu, m))
            target = g->slowdown_c + 2.0;
        double tau = g->thermal_tau_s > 0 ? g->thermal_tau_s : 1e-9;
        s->temp_c += (target - s->temp_c) * (1.0 - exp(-dt / tau));
        if (g->shutdown_c > 0 && s->temp_c >= g->shutdown_c && g_sim.thermal_lost_ns[gpu] < 0)
            thermal_shutdown(gpu, b);
        if (g->shutdown_c > 0 && s->temp_c > g->shutdown_c) s->temp_c = g->shutdown_c;
        s->t_ns = b;
    }
}

/* Rebuild the per-kind event indices; call after events[] changed (lock held). */
void sim_index_events(void) {
    g_sim.n_throttle = g_sim.n_lost = g_sim.n_slow = 0;
    for (int i = 0; i < g_sim.nevents; i++) {
        const sim_event *e = &g_sim.events[i];
        if (e->kind == EV_THROTTLE) g_sim.idx_throttle[g_sim.n_throttle++] = i;
        else if (e->kind == EV_SLOW) g_sim.idx_slow[g_sim.n_slow++] = i;
        else if (e->kind == EV_LOST || (e->kind == EV_XID && (long long)e->a == 79))
            g_sim.idx_lost[g_sim.n_lost++] = i;
    }
}

int sim_is_lost(int gpu, long long t) {
    if (g_sim.thermal_lost_ns[gpu] >= 0 && t >= g_sim.thermal_lost_ns[gpu]) return 1;
    for (int k = 0; k < g_sim.n_lost; k++) {
        const sim_event *e = &g_sim.events[g_sim.idx_lost[k]];
        if ((e->gpu == gpu || e->gpu == -1) && t >= e->start_ns) return 1;
    }
    return 0;
}

static double ramp_frac(const sim_event *e, long long t) {
    if (t < e->start_ns) return 0.0;
    if (e->dur_ns <= 0 || t >= e->start_ns + e->dur_ns) return 1.0;
    return (double)(t - e->start_ns) / (double)e->dur_ns;
}

void sim_ecc_counts(int gpu, long long t, unsigned long long *corr, unsigned long long *unc) {
    unsigned long long c = 0, u = 0;
    for (int i = 0; i < g_sim.nevents; i++) {
        const sim_event *e = &g_sim.events[i];
        if (e->kind != EV_ECC || (e->gpu != gpu && e->gpu != -1)) continue;
        double f = ramp_frac(e, t);
        c += (unsigned long long)floor(e->a * f);
        u += (unsigned long long)floor(e->b * f);
    }
    *corr = c;
    *unc = u;
}

void sim_remap_counts(int gpu, long long t, unsigned int out[4]) {
    out[0] = out[1] = out[2] = out[3] = 0;
    for (int i = 0; i < g_sim.nevents; i++) {
        const sim_event *e = &g_sim.events[i];
        if (e->kind != EV_REMAP || (e->gpu != gpu && e->gpu != -1) || t < e->start_ns) continue;
        out[0] += (unsigned int)e->a;
        out[1] += (unsigned int)e->b;
        out[2] += (unsigned int)e->c;
        out[3] += (unsigned int)e->d;
    }
    /* pending/failure are flags in NVML */
    out[2] = out[2] ? 1 : 0;
    out[3] = out[3] ? 1 : 0;
}

long long sim_latency_us(int gpu, long long t) {
    long long us = g_sim.latency_us;
    for (int k = 0; k < g_sim.n_slow; k++) {
        const sim_event *e = &g_sim.events[g_sim.idx_slow[k]];
        if (t < e->start_ns || t >= e->start_ns + e->dur_ns) continue;
        if (e->gpu == -1 || e->gpu == gpu) us += (long long)e->a;
    }
    return us;
}

/*
 * Companions of scripted event i in st (call once per event, as it is added): an Xid 48
 * (uncorrectable, double-bit ECC error) on an Ampere or newer board arrives with
 *   - one uncorrectable ECC error (counters, DoubleBitEcc event);
 *   - on boards with row remapping: an uncorrectable row remap, pending until the next
 *     reset, announced as Xid 63;
 *   - Xid 94 (contained: the affected processes were stopped, the GPU goes on) or, with
 *     XID48_UNCONTAINED, Xid 95 (uncontained: the GPU needs a reset).
 * Older boards (dynamic page retirement) get only the ECC error. Returns -1 when the event
 * table is full.
 */
int sim_add_companions(sim_state *st, int i) {
    sim_event base = st->events[i];
    if (base.kind != EV_XID || (long long)base.a != 48 || ((int)base.b & XID48_ALONE)) return 0;
    const sim_gpu_config *g = &st->gpu[base.gpu < 0 ? 0 : base.gpu];
    int ampere = g->arch >= 7, remap = ampere && !(g->unsupported & FEAT_REMAPPED_ROWS);
    sim_event add[4];
    int n = 0;
    memset(add, 0, sizeof(add));
    add[n].kind = EV_ECC, add[n].b = 1, n++;
    if (remap) {
        add[n].kind = EV_REMAP, add[n].b = 1, add[n].c = 1, n++;
        add[n].kind = EV_XID, add[n].a = 63, add[n].b = XID48_ALONE, n++;
    }
    if (ampere) add[n].kind = EV_XID, add[n].a = ((int)base.b & XID48_UNCONTAINED) ? 95 : 94, n++;
    if (st->nevents + n > SIM_MAX_EVENTS) return -1;
    for (int k = 0; k < n; k++) {
        add[k].gpu = base.gpu;
        add[k].start_ns = base.start_ns;
        st->events[st->nevents++] = add[k];
    }
    return 0;
}
