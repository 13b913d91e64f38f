/* execute.h -- runs a cycle's response list on the set's data comm (execute.c). */
#ifndef KHOR_ENGINE_EXECUTE_H
#define KHOR_ENGINE_EXECUTE_H

#include "types.h"

/* Runs items in order (fusing allreduces) and completes their handles. */
void execute_items(eset *s, eitem *items, int n);
/* Frees the set's device side (edev), on the set thread when it ends. */
void execute_dev_release(eset *s);

#endif
