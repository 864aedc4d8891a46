export { PmixServer, WithStatus } from './server.js';
export type * from './server.js';
export { Keys } from './keys.js';
export { KEEPALIVE, setKeepAlive, type KeepAlive } from './keepalive.js';
export { Status, StatusName, Range, Persistence, Rank, PmixError } from './status.js';
export * from './values.js';
export * from './job-info.js';
