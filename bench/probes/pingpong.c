// Cross-thread round trips over a Unix socket: the cost of the wake-ups every FUSE request
// pays (bench/journal/2026-11-24-writes-without-capability-trip.md). Build: gcc -O2 -pthread -o pingpong pingpong.c; run it as is and
// under taskset -c 0.
#include <stdio.h>
#include <pthread.h>
#include <sys/socket.h>
#include <unistd.h>
#include <time.h>
int sv[2];
void* echo(void*a){char b[64];for(;;){int n=read(sv[1],b,64);if(n<=0)return 0;write(sv[1],b,n);}}
int main(){socketpair(AF_UNIX,SOCK_STREAM,0,sv);pthread_t t;pthread_create(&t,0,echo,0);
char b[64]={0};struct timespec a,c;clock_gettime(CLOCK_MONOTONIC,&a);int N=50000;
for(int i=0;i<N;i++){write(sv[0],b,16);read(sv[0],b,64);}
clock_gettime(CLOCK_MONOTONIC,&c);printf("round trip %.1f us\n",((c.tv_sec-a.tv_sec)*1e9+(c.tv_nsec-a.tv_nsec))/N/1000);}
