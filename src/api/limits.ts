// What one request may carry, and how many event streams may be open. A request over a limit is
// a 4xx naming the limit; together with the core's limits on counts (workers, psets, jobs, names),
// they bound the memory a client can make the sidecar hold.
export const REQUEST_LIMITS = {
  /** Length of an id, a worker address, a pset member or a path segment. */
  idLength: 256,
  hostLength: 255,
  /** Tags on a worker or in a selector, and the length of each. */
  tags: 32,
  tagLength: 64,
  /** Resource keys on a worker or in a selector, and the length of each key. */
  resources: 32,
  resourceKeyLength: 64,
  /** Hosts a selector may name. */
  selectorHosts: 1024,
  /** Members a pset or job lists explicitly. */
  members: 4096,
  /** Workers in one traffic report (PUT /v1/traffic). */
  trafficWorkers: 4096,
  /** Labels on a job, and the length of each key and value. */
  labels: 32,
  labelKeyLength: 64,
  labelValueLength: 1024,
  /** Bytes of one request body. */
  bodyBytes: 1024 * 1024,
} as const;

export interface StreamLimits {
  /** Event streams open at once; one more is refused with 429. */
  subscribers: number;
  /**
   * Events waiting for one slow reader; past this its stream is ended with an `overflow` event,
   * and the reader reconnects with Last-Event-ID to replay what the history still holds.
   */
  queuedEvents: number;
}

export const DEFAULT_STREAM_LIMITS: StreamLimits = { subscribers: 64, queuedEvents: 1000 };
