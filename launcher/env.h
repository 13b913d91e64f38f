/*
 * env.h -- the ranks' environment: what is the same in every rank of a host ("fixed"), the
 * identity that differs per rank ("slots", rewritten before each start), and khorrun's own
 * environment and -x variables under them.
 */
#ifndef KHOR_LAUNCHER_ENV_H
#define KHOR_LAUNCHER_ENV_H

#include "job.h"

/*
 * Every rank's identity goes out under two prefixes: KHOR_ for khor itself and HOROVOD_ for
 * scripts written for horovodrun, which read HOROVOD_RANK and friends directly.
 */
#define NPREFIXES ((size_t)2)
extern const char *const env_id_prefixes[NPREFIXES];
/*
 * The entries that differ between ranks: five under each prefix, then KHOR_WORKER_ID in an
 * elastic job (an empty slot, left out of the environment, otherwise). See env_fill_slots.
 */
#define SLOTS_PER_PREFIX 5
#define NSLOTS (SLOTS_PER_PREFIX * NPREFIXES + 1)
#define SLOT_LEN 288
/* The entries that are the same in every rank of a host: see main. */
#define MAX_FIXED 24

/*
 * Is the "NAME=value" entry one that stays on its own host (HOSTNAME, HOME, SSH_*, ...: the
 * list and the reasons are in env.c)? Every other variable goes to the ranks on other hosts.
 */
bool env_host_local(const char *entry);
/* Rank rk's identity, as placed by place_ranks or the elastic driver. */
void env_fill_slots(char (*slots)[SLOT_LEN], const struct rank *rk);
/* Appends one printf-made "NAME=value" to fixed; false when out of memory or room. */
bool env_add_fixed(char **fixed, size_t *nfixed, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));
/* The host name the ranks go by, for HOROVOD_HOSTNAME. */
void env_rank_hostname(const struct opts *o, char *out, size_t len);
/* VAR as the ranks will see it: the last -x VAR=VALUE, else khorrun's own; NULL if unset. */
const char *env_rank_value(const struct opts *o, const char *name);
/*
 * KHOR_HEARTBEAT_TIMEOUT and KHOR_HEARTBEAT_INTERVAL as the ranks will see them (the last
 * -x, else khorrun's environment, else the defaults), the interval at most a fifth of the
 * timeout; khorrun watches with them and passes them on. False with the reason said.
 */
bool env_heartbeat(const struct opts *o, int64_t *timeout_ms, int64_t *interval_ms);
/* The environment to start the ranks with; slots are rewritten before each start. */
char **env_build(const struct opts *o, char **fixed, size_t nfixed, char (*slots)[SLOT_LEN]);

#endif
