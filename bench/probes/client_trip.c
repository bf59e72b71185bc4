// client_trip FILE N: N ioctl(TCGETS) calls on a file of a mount: a request the client answers itself,
// without the server (FUSE sends every ioctl to the daemon); prints p10/p50/p90.
// Build: gcc -O2 -o client_trip client_trip.c
#include <stdio.h>
#include <stdlib.h>
#include <fcntl.h>
#include <termios.h>
#include <sys/ioctl.h>
#include <time.h>
static double now(void){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec/1e9;}
int cmp(const void*a,const void*b){double x=*(double*)a,y=*(double*)b;return x<y?-1:x>y;}
int main(int argc,char**argv){int n=atoi(argv[2]);double*v=malloc(n*sizeof(double));int fd=open(argv[1],O_RDONLY);struct termios t;
 for(int i=0;i<n;i++){double s=now();ioctl(fd,TCGETS,&t);v[i]=now()-s;}
 qsort(v,n,sizeof(double),cmp);printf("local trip: p10 %.1f us  p50 %.1f us  p90 %.1f us\n",v[n/10]*1e6,v[n/2]*1e6,v[n*9/10]*1e6);}
