/* The sandbox ("pause") process of every Pod on hack/cluster's node: holds
 * the Pod's namespaces, reaps the zombies handed to it, and exits 0 at once
 * on SIGTERM or SIGINT (a PID 1 that ignored SIGTERM would make every Pod
 * deletion wait out its grace period). Built with gcc -static: the image
 * holds this one file. */
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

static void stop(int sig) {
  (void)sig;
  _exit(0);
}

static void reap(int sig) {
  (void)sig;
  while (waitpid(-1, 0, WNOHANG) > 0) {
  }
}

int main(void) {
  struct sigaction sa = {0};
  sigemptyset(&sa.sa_mask);
  sa.sa_handler = stop;
  sigaction(SIGTERM, &sa, 0);
  sigaction(SIGINT, &sa, 0);
  sa.sa_handler = reap;
  sa.sa_flags = SA_NOCLDSTOP | SA_RESTART;
  sigaction(SIGCHLD, &sa, 0);
  for (;;) pause();
}
