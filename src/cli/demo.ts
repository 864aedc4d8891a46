// `dask-pmix demo` — to be completed with the Dask integration.
export async function demo(_args: string[]): Promise<number> {
  process.stderr.write('dask-pmix demo: not implemented yet\n');
  return 1;
}
