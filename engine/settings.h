/* settings.h -- an engine's settings, from runtime/config.c's table (settings.c). */
#ifndef KHOR_ENGINE_SETTINGS_H
#define KHOR_ENGINE_SETTINGS_H

#include "types.h"

khor_status settings_read(const khor_config *cfg, eng_settings *s, kerr *err);

#endif
