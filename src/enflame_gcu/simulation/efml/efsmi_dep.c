/* A library the simulated libefml depends on when it is installed as the vendor installs it
 * (under /usr/local/efsmi, linked from /usr/lib): the real libefml has dependencies there too,
 * so a container that mounts only /usr/lib cannot load it. */
__attribute__((visibility("default"))) int efsmi_sim_dep_ready(void) { return 1; }
