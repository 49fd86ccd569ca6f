/* sbx cp SRC DST: ID:PATH names a path in a sandbox, - a tar stream. */
#pragma once
#include "client.h"

int sbx_cp_main(int argc, char **argv, int (*open_client)(sbx_client *, const char *));
