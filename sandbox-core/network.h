/* Network "egress" for a sandbox: pasta plus an nftables filter (see
 * network.c). "none" needs nothing: the sandbox's own namespace has only lo. */
#pragma once
#include "netpolicy.h"
#include "sandbox.h"

/* Whether the tools egress needs are installed; *why says what is missing. */
bool sbx_net_egress_available(const char **why);
/* Called once the sandbox runs: filter, pasta, resolv.conf. */
int sbx_net_egress_start(sbx_sandbox *sb, sbx_error *err);
/* Stops pasta (a no-op for "none"). */
void sbx_net_stop(sbx_sandbox *sb);

/* Starts the nft run that lets the sandbox reach these addresses (given in
 * answers for its allowed names): its pid and pidfd, or -1 with errno. */
pid_t sbx_net_open_named(sbx_sandbox *sb, const sbx_dns_addr *a, int n, int *pidfd);
/* A socket of `type` made in the sandbox's network namespace and bound to
 * addr there (nonblocking, close-on-exec): the fd, or -errno. */
int sbx_netns_socket(sbx_sandbox *sb, int type, const struct sockaddr *addr, socklen_t alen);
/* The filtering resolver of a sandbox whose allowedHosts names hosts
 * (dnsfilter.c): on 127.0.0.1:53 in its namespace, it answers NXDOMAIN for
 * every name not allowed, asks the host's resolver for the others, and
 * lets the sandbox reach the addresses of the answer before it hears it. */
bool sbx_dns_filter_wanted(const sbx_sandbox *sb);
int sbx_dns_filter_start(sbx_sandbox *sb, sbx_error *err);
void sbx_dns_filter_stop(sbx_sandbox *sb);
