// cold_stat_latency ROOT: lstat of ROOT/aNN/bNN/fNNNNN.txt, file i in directory i % 100 (10,000 files),
// the calls sorted into latency buckets (drop caches first for a cold walk).
// Build: gcc -O2 -o cold_stat_latency cold_stat_latency.c
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <time.h>
static double now(void){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec/1e9;}
int main(int argc,char**argv){static char p[10000][256];for(int i=0;i<10000;i++){int d=i%100;snprintf(p[i],256,"%s/a%02d/b%02d/f%05d.txt",argv[1],d/10,d%10,i);}
 double b[8]={0};int c[8]={0};double lim[8]={5e-6,20e-6,50e-6,100e-6,200e-6,500e-6,1e-3,1e9};double tot=0;
 for(int i=0;i<10000;i++){struct stat st;double t=now();lstat(p[i],&st);t=now()-t;tot+=t;for(int k=0;k<8;k++)if(t<lim[k]){b[k]+=t;c[k]++;break;}}
 printf("total %.3f s\n",tot);for(int k=0;k<8;k++)printf("  < %8.0f us: %5d stats, %.3f s\n",lim[k]*1e6,c[k],b[k]);}
