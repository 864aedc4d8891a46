/* A PMIx client that waits for the sidecar to tell it its job ended: it registers for the event
 * codes Open MPI 5 registers (PROC_TERM_WO_SYNC, PROC_ABORTED_BY_SIG, PROC_ABORTED), prints {"init":true}, and prints one JSON line per event it receives, then
 * finalizes and exits 0 after the first one (or exits 3 after SECONDS, default 20, without any).
 */
#include <pmix.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static pmix_proc_t me;
static volatile int got = 0;

static void handler(size_t id, pmix_status_t status, const pmix_proc_t *source, pmix_info_t info[], size_t ninfo,
                    pmix_info_t *results, size_t nresults, pmix_event_notification_cbfunc_fn_t cbfunc, void *cbdata) {
    (void)id; (void)results; (void)nresults;
    const char *text = "";
    int terminate = 0;
    for (size_t i = 0; i < ninfo; i++) {
        if (PMIX_CHECK_KEY(&info[i], PMIX_EVENT_TEXT_MESSAGE) && info[i].value.type == PMIX_STRING) text = info[i].value.data.string;
        if (PMIX_CHECK_KEY(&info[i], PMIX_EVENT_TERMINATE_JOB)) terminate = 1;
    }
    printf("{\"rank\":%u,\"event\":%d,\"source_nspace\":\"%s\",\"terminate\":%s,\"text\":\"%s\"}\n", me.rank, status,
           source ? source->nspace : "", terminate ? "true" : "false", text);
    fflush(stdout);
    got = 1;
    if (cbfunc) cbfunc(PMIX_EVENT_ACTION_COMPLETE, NULL, 0, NULL, NULL, cbdata);
}

int main(int argc, char **argv) {
    int seconds = argc > 1 ? atoi(argv[1]) : 20;
    pmix_status_t rc = PMIx_Init(&me, NULL, 0);
    if (PMIX_SUCCESS != rc) { printf("{\"error\":\"init\",\"status\":%d}\n", rc); return 2; }
    pmix_status_t codes[3] = {PMIX_ERR_PROC_TERM_WO_SYNC, PMIX_ERR_PROC_ABORTED_BY_SIG, PMIX_ERR_PROC_ABORTED};
    PMIx_Register_event_handler(codes, 3, NULL, 0, handler, NULL, NULL);
    printf("{\"rank\":%u,\"init\":true}\n", me.rank);
    fflush(stdout);
    for (int i = 0; i < seconds * 100 && !got; i++) usleep(10000);
    PMIx_Finalize(NULL, 0);
    return got ? 0 : 3;
}
