/* The CPU engine's OpenMP wait policy (omp_policy.c says why it matters). */
#ifndef FT_OMP_POLICY_H
#define FT_OMP_POLICY_H

/* First thing in a tool's main: where the environment chooses no OpenMP wait policy
 * (OMP_WAIT_POLICY, GOMP_SPINCOUNT), execute the program again with
 * OMP_WAIT_POLICY=passive. Returns only when it does not (a policy was chosen, or the
 * exec failed). */
void ft_cpu_omp_policy_reexec(char **argv);

#endif
