// statfs_trip PATH N: N statfs() calls through a mount, each a round trip through the client and the server; prints p10/p50/p90
// Build: gcc -O2 -o statfs_trip statfs_trip.c
#include <stdio.h>
#include <stdlib.h>
#include <sys/vfs.h>
#include <time.h>
static double now(void){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec/1e9;}
int cmp(const void*a,const void*b){double x=*(double*)a,y=*(double*)b;return x<y?-1:x>y;}
int main(int argc,char**argv){int n=atoi(argv[2]);double*v=malloc(n*sizeof(double));struct statfs s;
 for(int i=0;i<n;i++){double t=now();if(statfs(argv[1],&s)){perror("statfs");return 1;}v[i]=now()-t;}
 qsort(v,n,sizeof(double),cmp);printf("p10 %.1f us  p50 %.1f us  p90 %.1f us\n",v[n/10]*1e6,v[n/2]*1e6,v[n*9/10]*1e6);}
