/* The syscall policy every sandboxed command runs under, as a table
 * compiled once into a BPF program (so the forked child only installs it). */
#pragma once
#include <stddef.h>

/* Compiles the policy; returns 0 or -errno. */
int sbx_seccomp_compile(void);
/* Installs the compiled filter in the calling process (no allocation:
 * safe between fork and exec). Sets no_new_privs first. */
int sbx_seccomp_install(void);
/* Number of rules in the policy table (for doctor and tests). */
size_t sbx_seccomp_rule_count(void);
