// Constants shared by the C job-exec helper (jobexec.c) and the agent's Go
// side; the Go names are in jobexec.go and spare.go.
#ifndef SANDBOXD_JOBEXEC_H
#define SANDBOXD_JOBEXEC_H

#define JOBEXEC_ARG "__job-exec"        // JobExecArg
#define JOBEXEC_SPARE_ARG "__job-spare" // SpareArg
#define JOBEXEC_SPARE_READY "ready"     // spareReady
#define JOBEXEC_OOM_SCORE_ADJ "500"     // oomScoreAdj

#endif
