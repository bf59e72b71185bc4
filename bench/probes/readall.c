// open/read/close (mode r) or lstat (mode s) of every path listed in LIST, PASSES times,
// printing each pass's seconds: warm-path cost without the bench's own overhead
// (bench/journal/2026-11-24-writes-without-capability-trip.md). Build: gcc -O2 -o readall readall.c; run: ./readall LIST 6 r
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <unistd.h>
#include <time.h>
#include <sys/stat.h>
int main(int argc,char**argv){
  // argv[1]=list file, argv[2]=passes, argv[3]=mode r|s
  FILE*f=fopen(argv[1],"r"); char **p=malloc(sizeof(char*)*200000); int n=0; char line[4096];
  while(fgets(line,sizeof line,f)){line[strcspn(line,"\n")]=0;p[n++]=strdup(line);}
  int passes=atoi(argv[2]); char buf[16384]; char mode=argv[3][0];
  for(int k=0;k<passes;k++){
    struct timespec a,b; clock_gettime(CLOCK_MONOTONIC,&a);
    for(int i=0;i<n;i++){
      if(mode=='s'){struct stat st; lstat(p[i],&st); continue;}
      int fd=open(p[i],O_RDONLY); if(fd<0){perror(p[i]);return 1;}
      while(read(fd,buf,sizeof buf)>0);
      close(fd);
    }
    clock_gettime(CLOCK_MONOTONIC,&b);
    printf("%.4f\n",(b.tv_sec-a.tv_sec)+(b.tv_nsec-a.tv_nsec)/1e9);
  }
}
