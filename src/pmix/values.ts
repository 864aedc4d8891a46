// The JavaScript form of PMIx values, as the native addon reads and writes them. A value keeps
// its exact PMIx data type because clients reject keys registered with the wrong width.

export interface Proc {
  nspace: string;
  rank: number;
}

export type NumberType =
  | 'byte'
  | 'pid'
  | 'int'
  | 'int8'
  | 'int16'
  | 'int32'
  | 'uint'
  | 'uint8'
  | 'uint16'
  | 'uint32'
  | 'float'
  | 'double'
  | 'status'
  | 'proc_rank'
  | 'persist'
  | 'scope'
  | 'data_range'
  | 'proc_state'
  | 'alloc_directive'
  | 'job_state'
  | 'link_state'
  | 'data_type'
  | 'info_directives';
export type WideType = 'size' | 'int64' | 'uint64' | 'time';
export type BytesType = 'byte_object' | 'regex' | 'compressed_string' | 'compressed_byte_object';

export interface Envar {
  envar: string;
  value: string;
  separator?: string;
}

export interface ProcInfo {
  proc: Proc;
  hostname: string | null;
  executable: string | null;
  pid: number;
  exitCode: number;
  state: number;
}

export type DataArray =
  | { type: 'info'; items: Info[] }
  | { type: 'proc'; items: Proc[] }
  | { type: 'string'; items: string[] }
  | { type: 'bool'; items: boolean[] }
  | { type: NumberType; items: number[] }
  | { type: WideType; items: (number | bigint)[] }
  | { type: BytesType; items: Buffer[] }
  | { type: 'proc_info'; items: ProcInfo[] }
  | { type: 'envar'; items: Envar[] };

export type Value =
  | { type: 'bool'; value: boolean }
  | { type: 'string'; value: string }
  | { type: NumberType; value: number }
  | { type: WideType; value: number | bigint }
  | { type: BytesType; value: Buffer }
  | { type: 'proc'; value: Proc }
  | { type: 'proc_nspace'; value: string }
  | { type: 'proc_info'; value: ProcInfo }
  | { type: 'envar'; value: Envar }
  | { type: 'timeval'; value: { sec: number; usec: number } }
  | { type: 'data_array'; value: DataArray }
  | { type: 'undef'; value: null }
  | { type: 'unsupported'; typeId: number; value: string };

export interface Info {
  key: string;
  value: Value;
  flags?: number;
}

/** Builders for typed values. */
export const v = {
  bool: (value: boolean): Value => ({ type: 'bool', value }),
  string: (value: string): Value => ({ type: 'string', value }),
  uint16: (value: number): Value => ({ type: 'uint16', value }),
  uint32: (value: number): Value => ({ type: 'uint32', value }),
  int: (value: number): Value => ({ type: 'int', value }),
  size: (value: number | bigint): Value => ({ type: 'size', value }),
  rank: (value: number): Value => ({ type: 'proc_rank', value }),
  status: (value: number): Value => ({ type: 'status', value }),
  range: (value: number): Value => ({ type: 'data_range', value }),
  proc: (value: Proc): Value => ({ type: 'proc', value }),
  bytes: (value: Buffer): Value => ({ type: 'byte_object', value }),
  regex: (value: Buffer): Value => ({ type: 'regex', value }),
  infos: (items: Info[]): Value => ({ type: 'data_array', value: { type: 'info', items } }),
  procs: (items: Proc[]): Value => ({ type: 'data_array', value: { type: 'proc', items } }),
};

export function info(key: string, value: Value): Info {
  return { key, value };
}

/** The first value under `key`, if any. */
export function findValue(infos: readonly Info[] | undefined, key: string): Value | undefined {
  return infos?.find((i) => i.key === key)?.value;
}

/** True when `key` is present with a true value (PMIx treats a bare key as true). */
export function isTrue(infos: readonly Info[] | undefined, key: string): boolean {
  const val = findValue(infos, key);
  if (!val) return false;
  if (val.type === 'bool') return val.value;
  if (val.type === 'undef') return true;
  return false;
}

/** A numeric value under `key`, whatever its integer width. */
export function findNumber(infos: readonly Info[] | undefined, key: string): number | undefined {
  const val = findValue(infos, key);
  if (!val) return undefined;
  if (typeof val.value === 'number') return val.value;
  if (typeof val.value === 'bigint') return Number(val.value);
  return undefined;
}

export function findString(infos: readonly Info[] | undefined, key: string): string | undefined {
  const val = findValue(infos, key);
  return val && val.type === 'string' ? val.value : undefined;
}
