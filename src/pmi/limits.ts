// What the server advertises (PMI-1 get_maxes) and enforces, and the frame bounds that follow
// from it: every command the advertised maxima allow must fit a frame, and nothing longer is
// ever buffered.

/**
 * Same as hydra's (PMI_MAXKVSLEN, PMI_MAXKEYLEN, PMI_MAXVALLEN). MPICH 4.0.2 shrinks vallen_max
 * so that its `put` fits its own 1024-byte line and splits longer values into segments itself;
 * MPICH 5 does not shrink it: its segment puts run to about 1090 bytes.
 * Service names (publish/lookup) are held to kvsnameMax.
 */
export const LIMITS = { kvsnameMax: 256, keyMax: 64, valueMax: 1024 } as const;

/**
 * The longest PMI-1 line, newline included: `cmd=put kvsname= key= value=` with every field at
 * its maximum (1373 bytes). The other commands are shorter (publish_name carries a service name
 * and a port of at most kvsnameMax and valueMax; abort leaves its message room to match).
 */
export const PMI1_MAX_LINE =
  'cmd=put kvsname= key= value=\n'.length + LIMITS.kvsnameMax + LIMITS.keyMax + LIMITS.valueMax;

/** PMII_MAX_COMMAND_LEN of MPICH's PMI-2 client: far above the longest kvs-put, even escaped. */
export const PMI2_MAX_BODY = 64 * 1024;
