/*
 * stages/export/dflash_py.c — stages/export/dflash.py (our transformers modeling file for the z-lab layout's
 * auto_map) linked in as bytes, NUL-terminated, so dflash-export writes the file the repository holds without a
 * generated C copy. The path is relative to the repository root, where make runs the compiler; the Makefile names
 * the .py as a prerequisite of this object.
 */
#include "export/export.h"

__asm__(".section .rodata\n"
        ".global export_dflash_py\n"
        ".type export_dflash_py, @object\n"
        "export_dflash_py:\n"
        ".incbin \"stages/export/dflash.py\"\n"
        ".byte 0\n"
        ".size export_dflash_py, . - export_dflash_py\n"
        ".previous\n");
