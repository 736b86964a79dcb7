package leaderelection

import metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

func metaFor(c Config) metav1.ObjectMeta {
	return metav1.ObjectMeta{Name: LeaseName, Namespace: c.LeaderElectionNamespace}
}
