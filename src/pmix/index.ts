export * from './job-info.js';
export { KEEPALIVE, type KeepAlive, setKeepAlive } from './keepalive.js';
export { Keys } from './keys.js';
export type * from './server.js';
export { PmixServer, WithStatus } from './server.js';
export { Persistence, PmixError, Range, Rank, Status, StatusName } from './status.js';
export * from './values.js';
