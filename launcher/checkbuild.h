/* checkbuild.h -- `khorrun --check-build`: what this khor was built with (khor_build_info). */
#ifndef KHOR_LAUNCHER_CHECKBUILD_H
#define KHOR_LAUNCHER_CHECKBUILD_H

#include <stdbool.h>

/* Prints the report on stdout; returns the exit status (0). */
int checkbuild_print(bool verbose);

#endif
