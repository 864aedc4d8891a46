// `dask-pmix serve` — to be completed with the sidecar service.
export async function serve(_args: string[]): Promise<number> {
  process.stderr.write('dask-pmix serve: not implemented yet\n');
  return 1;
}
