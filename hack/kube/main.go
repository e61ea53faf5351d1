// Command kube is the real Kubernetes control plane of the local cluster in one binary:
// kube-apiserver, kube-controller-manager, kube-scheduler, etcd and kubectl, built from their
// published Go modules at the versions pinned in versions.env (see build.sh).
//
// One binary is one link step instead of five. It runs one component per process, named by its
// first argument or by the name it is invoked under (a symlink called kube-apiserver works too):
//
//	kube kube-apiserver --etcd-servers=... ...
//	kube etcd --data-dir=... ...
//	kube kubectl --kubeconfig=... get pods
//
// Each component's main body is the one of its upstream cmd/ package. Never run two components in
// one process: the API server's signal handler panics if it is set up twice.
package main

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"

	_ "time/tzdata" // CronJob time zones, as upstream's kube-apiserver and kube-controller-manager.

	"go.etcd.io/etcd/server/v3/etcdmain"
	_ "k8s.io/client-go/plugin/pkg/client/auth" // kubectl's client auth plugins.
	"k8s.io/component-base/cli"
	"k8s.io/component-base/logs"
	_ "k8s.io/component-base/logs/json/register"          // JSON log format.
	_ "k8s.io/component-base/metrics/prometheus/clientgo" // client-go metrics.
	_ "k8s.io/component-base/metrics/prometheus/version"  // version metric.
	kubectlcmd "k8s.io/kubectl/pkg/cmd"
	kubectlutil "k8s.io/kubectl/pkg/cmd/util"
	apiserver "k8s.io/kubernetes/cmd/kube-apiserver/app"
	controllermanager "k8s.io/kubernetes/cmd/kube-controller-manager/app"
	scheduler "k8s.io/kubernetes/cmd/kube-scheduler/app"
)

// components maps a component's name to its main body, which reads os.Args as its own command
// line and returns the process's exit code (or exits itself).
var components = map[string]func() int{
	"kube-apiserver": func() int { return cli.Run(apiserver.NewAPIServerCommand()) },
	"kube-controller-manager": func() int {
		return cli.Run(controllermanager.NewControllerManagerCommand())
	},
	"kube-scheduler": func() int { return cli.Run(scheduler.NewSchedulerCommand()) },
	"etcd": func() int {
		etcdmain.Main(os.Args)
		return 0
	},
	"kubectl": func() int {
		// As upstream's cmd/kubectl: set the verbosity before the command is built, so that
		// building it (plugins, .kuberc) logs at the level asked for.
		logs.GlogSetter(kubectlcmd.GetLogVerbosity(os.Args)) //nolint:errcheck
		if err := cli.RunNoErrOutput(kubectlcmd.NewDefaultKubectlCommand()); err != nil {
			kubectlutil.CheckErr(err)
		}
		return 0
	},
}

func main() {
	name, args := filepath.Base(os.Args[0]), os.Args[1:]
	if _, ok := components[name]; !ok && len(args) > 0 {
		name, args = args[0], args[1:]
	}
	run, ok := components[name]
	if !ok {
		names := make([]string, 0, len(components))
		for n := range components {
			names = append(names, n)
		}
		sort.Strings(names)
		fmt.Fprintf(os.Stderr, "usage: %s COMPONENT [ARGS...]\ncomponents: %v\n", filepath.Base(os.Args[0]), names)
		os.Exit(2)
	}
	// Every component reads its command line from os.Args (cobra, kubectl's plugin lookup, etcd's
	// flag parser), so it sees exactly what its own binary would have seen.
	os.Args = append([]string{name}, args...)
	os.Exit(run())
}
