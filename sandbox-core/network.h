/* Network "egress" for a sandbox: pasta plus an nftables filter (see
 * network.c). "none" needs nothing: the sandbox's own namespace has only lo. */
#pragma once
#include "sandbox.h"

/* Whether the tools egress needs are installed; *why says what is missing. */
bool sbx_net_egress_available(const char **why);
/* Called once the sandbox runs: filter, pasta, resolv.conf. */
int sbx_net_egress_start(sbx_sandbox *sb, sbx_error *err);
/* Stops pasta (a no-op for "none"). */
void sbx_net_stop(sbx_sandbox *sb);
