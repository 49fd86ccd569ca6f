/* `sbx doctor`: what this kernel offers and which path sbx takes. */
#pragma once
#include <stdio.h>

/* Prints one line per feature; returns the number of problems. */
int sbx_doctor(FILE *out);
